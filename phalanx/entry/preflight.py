"""Checks of a run against its data, in the driver, before any process starts.

A training loop over epochs must take at least one step per epoch: a batch larger than a
worker's shard (or an empty training split) would otherwise make every strategy loop over
empty epochs forever, writing an ``eval`` event each time. This module refuses that in one
line for every strategy; :func:`phalanx.data.sharding.epoch_batches` refuses it again
inside the loops (under ``torchrun`` no driver checked first).
"""

from __future__ import annotations

from phalanx.errors import ConfigError, DataError
from phalanx.parallel.base import Job
from phalanx.parallel.registry import spec


def data_shards(cfg) -> tuple[int, str]:
    """How many disjoint shards the strategy splits the training set into, and the flag
    (its spec's ``shards_by``; one stream over the whole set when it has none)."""
    return spec(cfg.strategy).data_shards(cfg)


def check_job_data(job: Job) -> None:
    """One-line error unless every worker can take at least one full batch per epoch and
    the test split can be evaluated."""
    cfg = job.config
    if len(job.train) == 0:
        raise DataError(f"--data {cfg.data}: the training split is empty")
    if len(job.test) == 0:
        raise DataError(f"--data {cfg.data}: the test split is empty (nothing to evaluate on)")
    shards, flag = data_shards(cfg)
    smallest = min(len(job.shard(r, shards)) for r in range(shards)) if shards > 1 else len(
        job.train)
    if cfg.batch_size > smallest:
        where = (f"a worker's shard ({smallest} samples with --{flag} {shards})" if shards > 1
                 else f"the training set ({smallest} samples)")
        raise ConfigError(f"--batch-size: {cfg.batch_size} is larger than {where}; an epoch "
                          "would have no step")
    check_grad_accum(job)


def check_grad_accum(job: Job) -> None:
    """More micro-batches per step than an epoch holds would stretch one optimizer step
    over several epochs (and evaluate between its micro-batches)."""
    cfg = job.config
    shards, _ = data_shards(cfg)
    per_epoch = min(len(job.shard(r, shards)) for r in range(shards)) // cfg.batch_size
    if cfg.grad_accum > per_epoch:
        raise ConfigError(f"--grad-accum: {cfg.grad_accum} micro-batches per step, but an "
                          f"epoch has only {per_epoch} batches of {cfg.batch_size}")
