"""What the heterogeneity-aware goodput policy (``goodput_typed.py``) may know beyond Sia's
information, each an option of it: ``share`` (a per-application prior from every job's
observations of the set-ups they ran) and the two ABLATIONS of ``knowledge``, which read
every measured profile (``offline-fit``: the throughput model fitted once to them;
``oracle``: the simulator's own step-time table). Never a headline (module doc of
``goodput_typed.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from phalanx.cluster.model.learned import AppFacts, JobKnowledge, Learner, efficiency
from phalanx.cluster.model.perf_fit import EPS, fit_perf_params
from phalanx.cluster.model.profiles import BatchConfig, PolluxApplication
from phalanx.cluster.policies.typed_base import TypedLearner, TypeInfo


class SharedTypedLearner(TypedLearner):
    """``TypedLearner`` whose per-type learners also pool every job's observations per
    application (``Learner(share=True)``)."""

    def __init__(self, typed_facts: Mapping[str, Mapping[str, AppFacts]]) -> None:
        self.by_type = {t: Learner(dict(f), share=True) for t, f in typed_facts.items()}


def offline_fit(app: PolluxApplication) -> JobKnowledge:
    """ABLATION: the throughput model fitted once to every measured point of ``app``'s
    profile (as many set-ups as were ever measured, which no Sia job sees)."""
    pts = np.array(app.measured(), dtype=float)
    k = JobKnowledge(AppFacts.of(app))
    k.params = fit_perf_params(pts[:, 0], pts[:, 1], pts[:, 2], pts[:, 3] - pts[:, 4],
                               pts[:, 3])
    k.profile = {(int(n), int(g), float(b)): (st, sy) for n, g, b, st, sy in pts}
    return k


def config_counts(nodes: int, gpus: int, node_gpus: int) -> tuple[int, ...]:
    """GPUs per node of a (nodes, GPUs) configuration, whole nodes packed."""
    if nodes <= 1:
        return (gpus,)
    per = [gpus // nodes] * nodes
    for i in range(gpus % nodes):
        per[i] += 1
    return tuple(per) if gpus % node_gpus else tuple([node_gpus] * (gpus // node_gpus))


class TrueTable:
    """ABLATION (oracle): the simulator's own step time of every candidate batch of a
    configuration (``optimize_batch``'s 50 geometric total batches, the placement's
    per-GPU limits as the engine applies them), cached per (application, nodes, GPUs,
    largest batch)."""

    def __init__(self, apps: Mapping[str, PolluxApplication], node_gpus: int) -> None:
        self.apps, self.node_gpus = apps, node_gpus
        self._c: dict[tuple[str, int, int, int], tuple[np.ndarray, ...]] = {}

    def candidates(self, app: str, facts: AppFacts, nodes: int, gpus: int
                   ) -> tuple[np.ndarray, ...]:
        key = (app, nodes, gpus, facts.max_batch)
        hit = self._c.get(key)
        if hit is None:
            a = self.apps[app]
            counts = config_counts(nodes, gpus, self.node_gpus)
            top, cap = a.local_limits(counts)
            lo, hi = facts.min_local_bsz, top
            batch = np.geomspace(max(facts.init_batch, lo * gpus), facts.max_batch)
            local = batch / gpus
            accum = np.ceil(local / hi - EPS) - 1
            if gpus == 1:
                accum = np.where(local > facts.init_batch + EPS, np.maximum(accum, 1), accum)
            accum = accum.astype(int)
            atomic = np.ceil(local / (accum + 1) - EPS).astype(int)
            ok = (lo <= atomic) & (atomic <= hi)
            if cap is not None:
                atomic = np.minimum(atomic, int(cap))
            atomic = np.minimum(atomic, (facts.max_batch / (gpus * (accum + 1))).astype(int))
            t = np.array([a.config_step_time(counts, BatchConfig(int(x), int(k), gpus))
                          * a.slowdown if o else 1.0
                          for x, k, o in zip(atomic, accum, ok)])
            total = gpus * atomic * (accum + 1)
            hit = self._c[key] = (atomic, accum, total, t, ok)
        return hit

    def best(self, app: str, facts: AppFacts, grad: tuple[float, float], nodes: int,
             gpus: int) -> tuple[float, int, int]:
        """(true goodput, per-GPU batch, accumulation steps) of the best candidate."""
        atomic, accum, total, t, ok = self.candidates(app, facts, nodes, gpus)
        good = np.where(ok, efficiency(total, facts.init_batch, *grad) * total
                        / facts.init_batch / t, 0.0)
        i = int(np.argmax(good))
        return float(good[i]), int(atomic[i]), int(accum[i])


class OracleKnowledge(JobKnowledge):
    """ABLATION (oracle): a job that picks its batch by the simulator's own table."""

    table: TrueTable

    def batch_config(self, nodes: int, replicas: int, max_local: float | None = None,
                     replicas_cap: float | None = None) -> BatchConfig:
        if self.target_batch or self.grad is None:
            return super().batch_config(nodes, replicas, max_local, replicas_cap)
        _, a, k = self.table.best(self.facts.name, self.facts, self.grad, nodes, replicas)
        return BatchConfig(a, k, replicas)


class KnownLearner(Learner):
    """ABLATION: a type's ``Learner`` whose jobs predict with ``offline_fit``'s model of
    their application (their own gradient statistics), or the true table (oracle)."""

    def __init__(self, facts: Mapping[str, AppFacts], fitted: Mapping[str, JobKnowledge],
                 table: TrueTable | None) -> None:
        super().__init__(dict(facts))
        self.pools, self.table = dict(fitted), table

    def _new(self, app: str, target_batch: int = 0) -> JobKnowledge:
        if self.table is None:
            return super()._new(app, target_batch)
        gammas = self.gammas
        k = OracleKnowledge(self.facts[app], target_batch,
                            lambda *a: fit_perf_params(*a, gammas=gammas))
        k.table = self.table
        return k

    def knowledge(self, jid: int, app: str) -> JobKnowledge:
        return self.job(jid, app).with_prior(self.pools[app])


class KnownTypedLearner(TypedLearner):
    """ABLATION: ``TypedLearner`` of ``KnownLearner``s (one per type)."""

    def __init__(self, typed: Mapping[str, Mapping[str, PolluxApplication]],
                 types: Sequence[TypeInfo], oracle: bool) -> None:
        node = {t.name: t.node_gpus for t in types}
        self.by_type = {
            t: KnownLearner({a: AppFacts.of(x) for a, x in apps.items()},
                            {a: offline_fit(x) for a, x in apps.items()},
                            TrueTable(apps, node[t]) if oracle else None)
            for t, apps in typed.items()}
        self.grad: dict[int, tuple[float, float]] = {}
