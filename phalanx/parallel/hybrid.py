"""Hybrid parallelism: ``--replicas`` R data-parallel copies of a ``--stages`` P pipeline.

P * R processes; rank = replica * P + stage. Each replica is a pipeline (GPipe or 1F1B,
:mod:`phalanx.parallel.pipeline`) over its own data shard; after the micro-batches of a
step, the R copies of each stage average their gradients over a per-stage process group
(``dist.new_group``), so every replica applies the same update and the run equals
single-process training on the R replicas' batches concatenated.
"""

from __future__ import annotations

from phalanx.config import RunConfig
from phalanx.metrics import EventLog
from phalanx.parallel.base import Job, Outcome, read_result
from phalanx.parallel.pipeline import DEVICE, check, train_pipeline
from phalanx.parallel.spec import StrategySpec, momentum_for
from phalanx.runtime.launch import spawn
from phalanx.runtime.placement import spawn_backend
from phalanx.runtime.supervise import PIPELINING, preload


def world_size(cfg: RunConfig) -> int:
    return cfg.stages * cfg.replicas


def run(job: Job, log: EventLog) -> Outcome:
    cfg = job.config
    check(job, cfg.stages, cfg.replicas)
    preload(PIPELINING)  # the ranks' schedules: imported once, in the fork server
    spawn(process_main, world_size(cfg), (job,),
          backend=spawn_backend(cfg, world_size(cfg), DEVICE))
    return read_result(job)


def process_main(rank: int, world: int, job: Job) -> None:
    train_pipeline(rank, world, job, job.config.stages, job.config.replicas)


def stage_ranks(cfg: RunConfig) -> tuple[int, str]:
    return (cfg.stages * cfg.replicas,
            f"--stages {cfg.stages} x --replicas {cfg.replicas}")


def replicas_momentum(cfg: RunConfig) -> tuple[str, float] | None:
    """R replicas average their gradients: R x fewer steps per epoch (spec.momentum_for)."""
    return momentum_for(cfg.replicas, cfg)


SPEC = StrategySpec(
    "hybrid", "hybrid: --replicas data-parallel copies of a --stages pipeline", run,
    process_main, world_size, options=("microbatches", "pipeline_schedule", "replicas", "stages"),
    shards_by="replicas", compute_ranks=stage_ranks, device=DEVICE,
    unused={"workers": "it runs --stages x --replicas processes"},
    default_rule=replicas_momentum,  # R x fewer steps per epoch: docs/model-parallel.md
    example={"stages": 2, "replicas": 2, "microbatches": 2})
