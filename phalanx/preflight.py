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
