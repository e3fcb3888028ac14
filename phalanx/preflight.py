"""Checks of a run against its data, in the driver, before any process starts.

A training loop over epochs must take at least one step per epoch: a batch larger than a
worker's shard (or an empty training split) would otherwise make every strategy loop over
empty epochs forever, writing an ``eval`` event each time. This module refuses that in one
line for every strategy; :func:`phalanx.data.sharding.epoch_batches` refuses it again
inside the loops (under ``torchrun`` no driver checked first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx.errors import ConfigError, DataError

if TYPE_CHECKING:  # the CLI checks flags with this module before torch is imported
    from phalanx.parallel.base import Job

# strategies whose workers each train on their own shard of the data, and the flag that
# sets how many shards there are; every other strategy walks the whole set as one stream
_SHARDED_BY = {"sync": "workers", "average": "workers", "bsp": "workers", "asp": "workers",
               "ssp": "workers", "softsync": "workers", "downpour": "workers",
               "dc-asgd": "workers", "hogwild": "workers", "hybrid": "replicas"}


def data_shards(strategy: str, cfg) -> tuple[int, str]:
    """How many disjoint shards the strategy splits the training set into, and the flag."""
    flag = _SHARDED_BY.get(strategy)
    if flag is None:
        return 1, ""
    return int(getattr(cfg, flag)), flag


def check_job_data(job: Job) -> None:
    """One-line error unless every worker can take at least one full batch per epoch and
    the test split can be evaluated."""
    cfg = job.config
    if len(job.train) == 0:
        raise DataError(f"--data {cfg.data}: the training split is empty")
    if len(job.test) == 0:
        raise DataError(f"--data {cfg.data}: the test split is empty (nothing to evaluate on)")
    shards, flag = data_shards(cfg.strategy, cfg)
    smallest = min(len(job.shard(r, shards)) for r in range(shards)) if shards > 1 else len(
        job.train)
    if cfg.batch_size > smallest:
        where = (f"a worker's shard ({smallest} samples with --{flag} {shards})" if shards > 1
                 else f"the training set ({smallest} samples)")
        raise ConfigError(f"--batch-size: {cfg.batch_size} is larger than {where}; an epoch "
                          "would have no step")
    check_grad_accum(job)


# settings only some strategies read (checked against the code that reads them); a value
# other than the default with any other strategy would be silently dropped, so it is refused
ONLY_FOR: dict[str, tuple[str, ...]] = {
    "dc_lambda": ("dc-asgd",),
    "dc_adaptive": ("dc-asgd",),
    "dc_momentum": ("dc-asgd",),
    "staleness": ("ssp",),
    "softsync": ("softsync",),
    "period": ("average",),
    "average_optimizer_state": ("average",),
    "lock": ("hogwild",),
    "microbatches": ("pipeline", "hybrid"),
    "pipeline_schedule": ("pipeline", "hybrid"),
    "replicas": ("hybrid",),
    "split_layer": ("model-parallel",),
    "bucket_mb": ("sync",),
    "downpour_local_steps": ("downpour",),
}


def check_flags_apply(cfg) -> None:
    """Refuse a setting that the chosen strategy would ignore (``phalanx train``)."""
    import dataclasses

    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    for name, strategies in ONLY_FOR.items():
        if cfg.strategy not in strategies and getattr(cfg, name) != defaults[name]:
            raise ConfigError(f"--{name.replace('_', '-')}: --strategy {cfg.strategy} does not "
                              f"use it (only {', '.join(strategies)}); drop it")
    if cfg.strategy == "single" and cfg.workers != 1:
        raise ConfigError(f"--workers: --strategy single trains with one worker, got "
                          f"{cfg.workers} (choose a parallel strategy, e.g. sync)")


def check_grad_accum(job: Job) -> None:
    """More micro-batches per step than an epoch holds would stretch one optimizer step
    over several epochs (and evaluate between its micro-batches)."""
    cfg = job.config
    shards, _ = data_shards(cfg.strategy, cfg)
    per_epoch = min(len(job.shard(r, shards)) for r in range(shards)) // cfg.batch_size
    if cfg.grad_accum > per_epoch:
        raise ConfigError(f"--grad-accum: {cfg.grad_accum} micro-batches per step, but an "
                          f"epoch has only {per_epoch} batches of {cfg.batch_size}")
