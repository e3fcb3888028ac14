"""Elastic resize of a stopped parameter-server run (bsp, asp, ssp, softsync, downpour,
dc-asgd): another worker count and per-worker batch; the shards (``--servers``) stay.

The shard checkpoints get the new worker count and one common clock for every worker
(:mod:`phalanx.ps.resize` says why); a worker's data position and RNG streams are not
checkpointed by the parameter server (a worker derives its position from its clock and
its RNG streams from the seed and its index), so the clock is the whole per-worker state.
``config.json`` gets the new settings, and what depends on the worker count follows it:

* **SoftSync**: ``--softsync n`` (pushes averaged per update) scales with the workers,
  ``n' = round(n W' / W)`` in 1..W'. n / W is what sets the protocol (Zhang et al. 2016:
  the staleness of an update grows as W / n; n = W is the sync-like end, n = 1 is ASP), so
  a run keeps its place between ASP and BSP instead of its group size.
* **BSP** with the strategy's default rule (momentum at 0.05 x (1 - m) x workers): the
  learning rate is the one a fresh run with W' workers gets (``resize_base.default_lr``,
  as for sync and average). A rule or rate the user chose stays.
* ``--max-steps`` (steps per worker) is converted to keep the run's sample budget.

Refused (one line, nothing rewritten): a run with injected faults (``--kill-worker``,
``--kill-server`` name steps and updates of the run as it was started, which a resize
renumbers), shard checkpoints missing or not of this run, and new settings a fresh run
would refuse (``--slow-workers`` naming a worker that no longer exists, a batch larger
than a worker's new shard).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from phalanx.cluster.live.resize_base import default_lr, micro_per_epoch, write_config
from phalanx.config import RunConfig
from phalanx.entry.api import make_job
from phalanx.errors import ConfigError
from phalanx.parallel.ps import consistency
from phalanx.parallel.ps_worker import steps_per_worker
from phalanx.parallel.registry import check_config
from phalanx.ps.checkpoint import read_shard, shard_path
from phalanx.ps.resize import common_clock, rewrite_shards, worker_steps
from phalanx.runtime.checkpoint import CheckpointError


def refusal(cfg: RunConfig) -> str:
    """Why a parameter-server run cannot be resized ('' when it can)."""
    if cfg.kill_worker or cfg.kill_server:
        return ("its injected faults (--kill-worker / --kill-server) name steps and updates "
                "of the run as started, which a resize renumbers")
    return ""


def resized_settings(old: RunConfig, workers: int, batch_size: int) -> RunConfig:
    """The run's settings for ``workers`` x ``batch_size`` (the module's rules)."""
    new = dataclasses.replace(old, workers=workers, batch_size=batch_size, resume="",
                              lr=default_lr(old, workers))
    if consistency(old).name.startswith("softsync"):
        new.softsync = max(1, min(workers, round(old.softsync * workers / old.workers)))
    if old.max_steps:
        new.max_steps = max(1, round(old.max_steps * old.workers * old.batch_size
                                     / (workers * batch_size)))
    return check_config(new)


def resize_ps(run_dir: Path, old: RunConfig, workers: int, batch_size: int
              ) -> tuple[int, int]:
    """Rewrite a stopped parameter-server run in ``run_dir`` for ``workers`` x
    ``batch_size``; returns (the workers' mean step before, the step they resume at)."""
    why = refusal(old)
    if why:
        raise ConfigError(f"{run_dir}: --strategy {old.strategy} cannot be resized: {why}")
    try:
        payloads = [read_shard(shard_path(run_dir, k), shard=k, servers=old.servers,
                               workers=old.workers, strategy=old.strategy)
                    for k in range(old.servers)]
    except CheckpointError as e:
        raise ConfigError(f"cannot resize: {e}") from None
    new = resized_settings(old, workers, batch_size)
    job = make_job(old)
    per_old, per_new = micro_per_epoch(run_dir, len(job.train), old, workers, batch_size)
    npush = old.npush
    steps = worker_steps(payloads, npush, steps_per_worker(job))
    clock = common_clock(steps, old.grad_accum, npush, per_old, per_new)
    rewrite_shards(run_dir, payloads, workers, clock)
    write_config(run_dir, new, ("workers", "batch_size", "softsync", "lr", "max_steps"))
    return sum(steps) // len(steps), clock * npush
