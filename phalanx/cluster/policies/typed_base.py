"""What every GPU-type-aware policy shares (Sia, Gavel, our typed goodput): the cluster's
types in the Sia artifact's order (siasosp23/artifacts, ``sia-simulator/``), the (nodes,
GPUs) configurations a job may get on each, a type's 1-GPU throughput, and one online
throughput model per type. Kept apart from the policies so that each policy's file shows
only what makes it different.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from phalanx.cluster.model.learned import AppFacts, JobKnowledge, Learner
from phalanx.cluster.model.profiles import PolluxApplication
from phalanx.errors import ConfigError

# ``sia.py``: (nodes, GPUs) a job may get on a type with 4- or 8-GPU nodes
CONFIGS_4GPU = ((1, 1), (1, 2), (1, 4)) + tuple((n, 4 * n) for n in range(2, 17))
CONFIGS_8GPU = ((1, 1), (1, 2), (1, 4), (1, 8)) + tuple((n, 8 * n) for n in range(2, 9))
ZERO_ALLOC_GAIN = 1e-4
GOODPUT_CLIP = 3000.0
# the artifact's cluster order (``simulator_config.cluster_nnodes``): the first fitted type
# in it is the one projected from
SIA_TYPE_ORDER = ("aws", "dgx-ext", "rtx", "azure", "quad", "dgx")


def one_gpu_throughput(app: PolluxApplication) -> float:
    """Samples per second of 1 GPU at its largest profiled per-GPU batch (the artifact
    divides the largest batch by the largest step time of the 1-GPU rows)."""
    rows = app.placements.get("1")
    if rows is None:
        raise ConfigError(f"{app.name} on {app.device_type}: no 1-GPU profile")
    step = rows.compute + rows.sync
    return float(rows.bsz.max() / step.max())


@dataclass(frozen=True)
class TypeInfo:
    """One GPU type of the cluster: its servers' size, node count and GPU total."""

    name: str
    node_gpus: int
    nodes: int

    @property
    def gpus(self) -> int:
        return self.node_gpus * self.nodes

    def configs(self) -> tuple[tuple[int, int], ...]:
        """(nodes, GPUs) a job may get: the artifact's tables for 4- and 8-GPU nodes;
        for other node sizes (a live cluster's) the powers of two inside one node, the
        whole node, then whole nodes."""
        if self.node_gpus in (4, 8):
            table = CONFIGS_4GPU if self.node_gpus == 4 else CONFIGS_8GPU
            return tuple(c for c in table if c[0] <= self.nodes)
        one = sorted({g for g in (1 << k for k in range(11)) if g < self.node_gpus}
                     | {self.node_gpus})
        return tuple((1, g) for g in one) + tuple((n, n * self.node_gpus)
                                                 for n in range(2, self.nodes + 1))


def cluster_types(servers: Sequence[tuple[str, int]]) -> tuple[TypeInfo, ...]:
    """(type, GPUs) of every server -> the types in the artifact's order. A type whose
    servers differ in size (a live cluster file may mix them) is offered as nodes of its
    smallest server, as many as its GPUs fill: every configuration fits, a gang of whole
    nodes may span servers unevenly (the placement packs it), and no GPU is promised
    that is not there."""
    by: dict[str, list[int]] = {}
    for t, g in servers:
        if g > 0:                     # a server without devices offers none
            by.setdefault(t, []).append(g)
    order = sorted(by, key=lambda t: (SIA_TYPE_ORDER.index(t) if t in SIA_TYPE_ORDER
                                      else len(SIA_TYPE_ORDER), t))
    return tuple(TypeInfo(t, min(by[t]), sum(by[t]) // min(by[t])) for t in order)


class TypedLearner:
    """One ``Learner`` per GPU type (a job's model on a type is fitted to what it ran
    there); the gradient statistics are the job's, whatever type measured them last."""

    def __init__(self, typed_facts: Mapping[str, Mapping[str, AppFacts]]) -> None:
        self.by_type = {t: Learner(dict(f)) for t, f in typed_facts.items()}
        self.grad: dict[int, tuple[float, float]] = {}

    def learner_for(self, device_type: str) -> Learner:
        return self.by_type[device_type]

    def knowledge(self, device_type: str, jid: int, app: str, current: str = ""
                  ) -> JobKnowledge:
        """The job's model on ``device_type``, with the gradient statistics last measured
        (on ``current``, the type it runs on now, when it has any there)."""
        k = self.by_type[device_type].job(jid, app)
        if current and current != device_type:
            here = self.by_type[current].jobs.get(jid)
            if here is not None and here.grad is not None:
                k.grad = here.grad
        return k

    def forget(self, jid: int) -> None:
        for lr in self.by_type.values():
            lr.forget(jid)
