"""The chaos job mix: short real training jobs of every kind the live scheduler runs, a few
seconds each on two cores, in a seeded order.

Every kind names what the invariants may ask of it: ``reference`` (its final parameters
equal an uninterrupted run's, bit for bit: sync, with and without PowerSGD's error
feedback, as ``tests/cluster/test_live_restart.py`` and ``test_slurm_live.py`` show), ``ps``
(a parameter-server job: each update applied once, docs/faults.md) and ``disk`` (its run
folder may sit on a small tmpfs that fills: a job that checkpoints every few steps)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

_MLP = {"model": "mlp", "data": "synthetic", "tensorboard": False}
_PS = {**_MLP, "epochs": 4, "checkpoint_every": 20, "ps_timeout": 2.0, "heartbeat_s": 0.5}


@dataclass(frozen=True, kw_only=True)
class JobKind:
    """One kind of job in the mix."""

    name: str
    gpus: int
    config: dict[str, Any] = field(default_factory=dict)
    reference: bool = False     # final parameters equal an uninterrupted run's
    ps: bool = False            # a parameter-server job (updates counted)
    disk: bool = False          # may run on the small tmpfs

    @property
    def servers(self) -> int:
        return int(self.config.get("servers", 1)) if self.ps else 0


KINDS: tuple[JobKind, ...] = (
    JobKind(name="sync", gpus=2, reference=True, disk=True, config={
        **_MLP, "strategy": "sync", "epochs": 100, "max_steps": 200, "checkpoint_every": 20,
        "seed": 3}),
    JobKind(name="asp", gpus=2, ps=True, config={**_PS, "strategy": "asp"}),
    JobKind(name="gpt", gpus=1, config={
        "model": "gpt", "data": "shakespeare", "gpt_layers": 1, "gpt_dim": 16,
        "gpt_heads": 2, "context": 16, "train_limit": 2000, "test_limit": 50,
        "max_steps": 40, "strategy": "single", "tensorboard": False}),
    JobKind(name="sync-powersgd", gpus=2, reference=True, disk=True, config={
        **_MLP, "strategy": "sync", "epochs": 100, "max_steps": 200, "checkpoint_every": 20,
        "seed": 4, "compress": "powersgd:1,warm"}),
    JobKind(name="ssp", gpus=2, ps=True, config={**_PS, "strategy": "ssp", "servers": 2}),
    JobKind(name="pipeline", gpus=2, config={
        **_MLP, "strategy": "pipeline", "stages": 2, "max_steps": 150}),
    JobKind(name="ctr", gpus=1, config={
        "model": "ctr", "data": "ctr-synthetic", "ctr_rows": 1000, "ctr_dim": 8,
        "train_limit": 3000, "test_limit": 500, "max_steps": 40, "strategy": "single",
        "tensorboard": False}),
)
BY_NAME = {k.name: k for k in KINDS}
CLUSTER = "uniform:1,1,1,4"     # four slots of this machine
ARRIVAL_GAP_S = 1.0             # job i arrives about i seconds in


def kinds_for(engine: str) -> tuple[JobKind, ...]:
    """The mix's kinds on ``engine``. On Ray a reference kind's ranks take one intra-op
    thread each wherever they run (a lone rank on a host would take 2, and its matmuls
    sum in another order than its uninterrupted run's on this machine's slots)."""
    if engine == "local":
        return KINDS
    return tuple(replace(k, config={**k.config, "worker_threads": 1}) if k.reference else k
                 for k in KINDS)


@dataclass(frozen=True)
class ChaosJob:
    """One entry of a run's job list."""

    name: str
    kind: JobKind
    arrival: float


def job_mix(count: int, seed: int, catalog: tuple[JobKind, ...] = KINDS) -> list[ChaosJob]:
    """``count`` jobs: every kind of ``catalog`` in turn (so a short list holds each kind
    once), shuffled in blocks by ``seed``, arriving about a second apart."""
    rng = random.Random(seed)
    kinds: list[JobKind] = []
    while len(kinds) < count:
        block = list(catalog)
        if kinds:   # the first block in catalog order: a short list covers every kind
            rng.shuffle(block)
        kinds += block
    return [ChaosJob(f"{i:02d}-{k.name}", k, round(i * ARRIVAL_GAP_S * rng.uniform(0.5, 1.0), 2))
            for i, k in enumerate(kinds[:count])]


def write_job_list(jobs: list[ChaosJob], path: Path) -> None:
    """The list as ``phalanx schedule --jobs`` reads it (YAML is a superset of JSON)."""
    entries = [{"name": j.name, "arrival": j.arrival, "gpus": j.kind.gpus,
                "config": j.kind.config} for j in jobs]
    path.write_text(json.dumps({"jobs": entries}, indent=1) + "\n")
