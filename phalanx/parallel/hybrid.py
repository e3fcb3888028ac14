"""Hybrid parallelism: ``--replicas`` R data-parallel copies of a ``--stages`` P pipeline.

P * R processes; rank = replica * P + stage. Each replica is a pipeline (GPipe or 1F1B,
:mod:`phalanx.parallel.pipeline`) over its own data shard; after the micro-batches of a
step, the R copies of each stage average their gradients over a per-stage process group
(``dist.new_group``), so every replica applies the same update and the run equals
single-process training on the R replicas' batches concatenated.
"""

from __future__ import annotations

from phalanx.config import RunConfig
from phalanx.parallel.base import Job
from phalanx.parallel.pipeline import DEVICE, check, train_pipeline
from phalanx.parallel.spec import StrategySpec, momentum_for
from phalanx.runtime.supervise import PIPELINING


def world_size(cfg: RunConfig) -> int:
    return cfg.stages * cfg.replicas


def check_job(job: Job) -> None:
    check(job, job.config.stages, job.config.replicas)


def process_main(rank: int, world: int, job: Job) -> None:
    train_pipeline(rank, world, job, job.config.stages, job.config.replicas)


def stage_ranks(cfg: RunConfig) -> tuple[int, str]:
    return (cfg.stages * cfg.replicas,
            f"--stages {cfg.stages} x --replicas {cfg.replicas}")


def replicas_momentum(cfg: RunConfig) -> tuple[str, float] | None:
    """R replicas average their gradients: R x fewer steps per epoch (spec.momentum_for)."""
    return momentum_for(cfg.replicas, cfg)


SPEC = StrategySpec(
    name="hybrid", summary="hybrid: --replicas data-parallel copies of a --stages pipeline",
    process_main=process_main, world_size=world_size, check_job=check_job,
    options=("microbatches", "pipeline_schedule", "replicas", "stages", "split_at"),
    shards_by="replicas", compute_ranks=stage_ranks, device=DEVICE,
    unused={"workers": "it runs --stages x --replicas processes"},
    default_rule=replicas_momentum,  # R x fewer steps per epoch: docs/model-parallel.md
    preload=(PIPELINING,), rank_name="rank",
    example={"stages": 2, "replicas": 2, "microbatches": 2})
