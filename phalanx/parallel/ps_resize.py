"""Elastic resize of a stopped parameter-server run (bsp, asp, ssp, softsync, downpour,
dc-asgd; their ``StrategySpec.resize``): another worker count and per-worker batch; the
shards (``--servers``) stay.

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
  learning rate is the one a fresh run with W' workers gets (``StrategySpec.resized_lr``,
  as for sync and average). A rule or rate the user chose stays.
* ``--max-steps`` (steps per worker) is converted to keep the run's sample budget.

Refused (one line, nothing rewritten): a run with injected faults (``--kill-worker``,
``--kill-server`` name steps and updates of the run as it was started, which a resize
renumbers), shard checkpoints missing or not of this run, and new settings a fresh run
would refuse (``--slow-workers`` naming a worker that no longer exists, a batch larger
than a worker's new shard).
"""

from __future__ import annotations

from phalanx.config import RunConfig
from phalanx.errors import ConfigError
from phalanx.parallel.base import Job
from phalanx.parallel.ps_worker import steps_per_worker
from phalanx.parallel.resize_base import micro_per_epoch, write_config
from phalanx.ps.checkpoint import read_shard, shard_path
from phalanx.ps.consistency import Consistency
from phalanx.ps.resize import common_clock, rewrite_shards, worker_steps
from phalanx.runtime.checkpoint import CheckpointError


def refusal(cfg: RunConfig) -> str:
    """Why a parameter-server run cannot be resized ('' when it can)."""
    if cfg.kill_worker or cfg.kill_server:
        return ("its injected faults (--kill-worker / --kill-server) name steps and updates "
                "of the run as started, which a resize renumbers")
    return ""


def settings(old: RunConfig, new: RunConfig, model: Consistency) -> RunConfig:
    """What follows the worker count besides the learning rate (the module's rules);
    ``model``: the run's consistency model."""
    if model.name.startswith("softsync"):
        new.softsync = max(1, min(new.workers, round(old.softsync * new.workers / old.workers)))
    if old.max_steps:
        new.max_steps = max(1, round(old.max_steps * old.workers * old.batch_size
                                     / (new.workers * new.batch_size)))
    return new


def rewrite(job: Job, new: RunConfig) -> tuple[int, int]:
    """Rewrite the stopped parameter-server run in ``job.run_dir`` for ``new``; returns (the
    workers' mean step before, the step they resume at)."""
    old, run_dir = job.config, job.run_dir
    try:
        payloads = [read_shard(shard_path(run_dir, k), shard=k, servers=old.servers,
                               workers=old.workers, strategy=old.strategy)
                    for k in range(old.servers)]
    except CheckpointError as e:
        raise ConfigError(f"cannot resize: {e}") from None
    per_old, per_new = micro_per_epoch(run_dir, len(job.train), old, new.workers,
                                       new.batch_size)
    npush = old.npush
    steps = worker_steps(payloads, npush, steps_per_worker(job))
    clock = common_clock(steps, old.grad_accum, npush, per_old, per_new)
    rewrite_shards(run_dir, payloads, new.workers, clock)
    write_config(run_dir, new, ("workers", "batch_size", "softsync", "lr", "max_steps"))
    return sum(steps) // len(steps), clock * npush
