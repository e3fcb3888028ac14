"""Elastic resize of sync and average (their ``StrategySpec.resize``): rewrite a stopped run
so that it resumes with another worker count and per-worker batch (the parameter server:
:mod:`~phalanx.parallel.ps_resize`; zero: :mod:`~phalanx.parallel.zero_resize`).

A sync or average checkpoint (:mod:`phalanx.parallel.dp_checkpoint`) holds one model, the
update rule's state, the position in the data and every rank's RNG streams. For another
worker count W' and batch b':

* the model and the shared rule state carry over as they are (``average``: each new rank
  takes rank 0's own rule state; right after an averaging round the replicas are equal);
* the position is kept *in epochs*: the same epoch, the same fraction of it consumed, in
  the new shards' micro-batches (steps are micro-batches of the new size, so the step
  count is converted, never copied);
* ranks 0..min(W, W')-1 keep their RNG streams and byte counts; new ranks start the
  streams a fresh run would give them (``seed + 1 + rank``);
* ``config.json`` gets the new ``workers`` and ``batch_size``, the checkpoint the
  fingerprint of the new settings, so ``--resume`` accepts it and checks it as always.

The learning rate follows the new settings as for a fresh run of them where the run uses
its strategy's default rule (momentum scaled with the workers;
:meth:`~phalanx.parallel.spec.StrategySpec.resized_lr`): config.json records it resolved,
so :func:`phalanx.entry.resize.resize_run` recomputes it, for every strategy. A run started
with one worker trains with single's plain SGD and keeps it (its rule state has no
momentum), as does a rule or rate the user chose. The continued trajectory is not the one
an unresized run would take: that is what resizing is.
"""

from __future__ import annotations

import torch

from phalanx.config import RunConfig
from phalanx.data import same_place
from phalanx.errors import ConfigError
from phalanx.parallel.base import Job
from phalanx.parallel.dp_checkpoint import FORMAT, checkpoint_path, fingerprint, read_checkpoint
from phalanx.parallel.resize_base import micro_per_epoch, write_config
from phalanx.parallel.spec import Resize
from phalanx.runtime.checkpoint import save_checkpoint


def rewrite(job: Job, new: RunConfig) -> tuple[int, int]:
    """Rewrite the stopped run in ``job.run_dir`` (checkpoint.pt and config.json) for ``new``;
    returns (old step, new step)."""
    old, run_dir = job.config, job.run_dir
    payload = read_checkpoint(old, checkpoint_path(run_dir))
    if payload.get("format") != FORMAT:
        raise ConfigError(f"{run_dir}: not a sync / average checkpoint: cannot resize")
    workers, batch_size = new.workers, new.batch_size
    ga = old.grad_accum
    per_old, per_new = micro_per_epoch(run_dir, len(job.train), old, workers, batch_size)
    epoch, micro = same_place(payload["step"] * ga, per_old, per_new)
    step = micro // ga
    ranks = payload["ranks"]
    fresh = []
    for r in range(workers):
        if r < len(ranks):
            fresh.append(ranks[r])
            continue
        aug = torch.Generator().manual_seed(new.seed + 1 + r).get_state()
        fresh.append([aug, ranks[0][1].clone(), torch.tensor(0, dtype=torch.int64),
                      *[t.clone() for t in ranks[0][3:]]])
    samples = payload["samples"] * old.workers // workers
    save_checkpoint(checkpoint_path(run_dir), {
        **payload, "workers": workers, "fingerprint": fingerprint(new), "step": step,
        "epoch": epoch, "samples": int(samples), "ranks": fresh,
        "comm": []})  # residuals are the old ranks': error feedback starts afresh
    write_config(run_dir, new, ("workers", "batch_size", "lr"))
    return payload["step"], step


RESIZE = Resize(rewrite=rewrite)
