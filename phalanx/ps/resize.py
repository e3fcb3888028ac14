"""Resizing a stopped parameter-server run: where its workers stand, and the shard
checkpoints rewritten for another worker count (the shards themselves stay as they are).

A worker's clock is the number of pushes it completed; under ``--resume`` a worker
continues from the smallest clock any shard holds for it (a shard that is ahead ignores
the repeated pushes by sequence number). Its steps are ``clock x --npush`` (at most the
run's steps per worker), its position in micro-batches ``steps x --grad-accum``.

**The clocks after a resize: every worker, on every shard, at one common clock**, the
run's *mean* position converted to the new micro-batches (same epoch, same fraction of
it, as sync's resize). Why the mean and not the slowest or the fastest worker's clock:

* the data is re-cut for the new worker count (every worker gets a new shard), so a
  surviving worker's own clock says nothing about its new shard; what carries over is
  how much of the run was trained, and the mean keeps exactly that (the total samples:
  the slowest worker's clock would train the spread again, the fastest would skip it);
* equal clocks satisfy every consistency model at once: BSP's barrier (with a naive copy,
  survivors at clock c and a new worker at 0, the survivors wait at the barrier while the
  new worker's c pushes pile up unapplied, all computed on the same weights, then are
  averaged into one update), SSP's bound (spread 0 <= s: nobody resumes ahead of it or
  held back by a worker far behind), and ASP / SoftSync have no clock bound;
* the rounding goes down to a whole push, so nothing is counted as trained that was not.

Everything else a shard holds carries over unchanged: parameters, the rule's state
(momentum, AdaGrad sums, DC-ASGD's mean square), the version (the staleness of the next
pushes counts from it) and the counters and staleness histogram (the run's history:
``pushes_applied`` still equals the histogram's total; the sum of the clocks no longer
equals the pushes received, since the clocks were renumbered). DC-ASGD's per-worker
backup weights are not in a checkpoint: each worker's first pull after the restart
(a resume pull) sets its backup, as after any resume.

Two things do not carry over, since they name the old workers: the pushes a stop found
in a shard's buffer (at most one half-collected BSP / SoftSync round; the common clock,
rounded down, already counts them as not trained) and the workers lost before the stop
(the new count is the scheduler's choice: every new worker trains).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import torch

from phalanx.data import same_place
from phalanx.ps.checkpoint import shard_path
from phalanx.runtime.checkpoint import save_checkpoint


def worker_steps(payloads: Sequence[dict], npush: int, total: int) -> list[int]:
    """Each worker's steps that every shard holds (what ``--resume`` continues from)."""
    workers = int(payloads[0]["clocks"].numel())
    return [min(min(int(p["clocks"][w]) for p in payloads) * npush, total)
            for w in range(workers)]


def common_clock(steps: Sequence[int], accum: int, npush: int, per_old: int,
                 per_new: int) -> int:
    """The one clock every worker resumes at: the workers' mean position in micro-batches
    (``per_old`` to an epoch) as the same epoch and fraction of it in ``per_new``
    micro-batches per epoch, rounded down to a whole push of ``accum x npush`` of them."""
    _, micro = same_place(Fraction(sum(steps) * accum, len(steps)), per_old, per_new)
    return micro // (accum * npush)


def rewrite_shards(run_dir: Path, payloads: Sequence[dict], workers: int, clock: int) -> None:
    """Write every shard's checkpoint back for ``workers`` workers, all at ``clock``."""
    for p in payloads:
        save_checkpoint(shard_path(run_dir, int(p["shard"])), {
            **p, "workers": workers,
            "clocks": torch.full((workers,), clock, dtype=torch.int64),
            "pending": torch.zeros(0, 4, dtype=torch.int64), "pending_tensors": [],
            "lost": torch.zeros(0, 2, dtype=torch.int64)})
