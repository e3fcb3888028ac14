"""``--policy goodput`` on a cluster of several GPU types: heterogeneity-aware, on the
information Sia has (equal information), no more.

What it knows of a job: each type's 1-GPU throughput of its application at arrival (the
bootstrap profile Sia gets: the largest per-GPU batch over its step time), then per type
only the set-ups the job has run there and the throughput model fitted to them
(``learned.py``, one ``Learner`` per type), and the gradient statistics at its current
batch. It never reads a measured profile beyond the 1-GPU figure, nor remaining work.

It chooses one (type, nodes, GPUs) configuration per job, or none, in one MILP per round
(``sia.solve_sia_milp``) like Sia, with these differences (each an option, measured as
an ablation in ``--study sia``):

* ``batch="job"``: the goodput of a configuration is predicted at the batch the job will
  really pick there (up to its application's largest batch, as the job does), not capped
  at the trace's batch as Sia's speedup functions are;
* ``restart="horizon"``: a change of configuration is valued ``T / (T + restart)`` of
  its goodput (T the horizon, restart the application's checkpoint-restore time as the
  engine charges it) and must beat the kept configuration by ``min_gain``, instead of
  Sia's age-based factor;
* ``weight="las"``: job values are weighted by 1 / (attained GPU-hours + 1) (least
  attained service, which needs no remaining work) on top of the power-mean fairness;
* ``growth``: a job may grow to this many times the most GPUs it ran on any type (Sia:
  2), so fewer restarts on the way to its size;
* ``share`` (an ablation, off by default: a Sia job sees only its own set-ups): a job of
  an application with no model on a type borrows the model fitted to every job of that
  application on that type (a prior from similar jobs: their observations of set-ups they
  ran, no measured profile), once it has run itself (its own gradient statistics).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from phalanx.cluster.core.view import Choice, JobView
from phalanx.cluster.model.learned import AppFacts, JobKnowledge, Learner, optimize_batch
from phalanx.cluster.model.profiles import PolluxApplication
from phalanx.cluster.policies.sia import (
    GOODPUT_CLIP,
    ZERO_ALLOC_GAIN,
    SiaPolicy,
    TypedLearner,
    TypeInfo,
    solve_sia_milp,
)
from phalanx.errors import ConfigError

BATCHES = ("job", "target")
RESTARTS = ("horizon", "sia")
WEIGHTS = ("none", "las")


@dataclass(frozen=True, kw_only=True)
class TypedOptions:
    """The heterogeneity-aware goodput policy's switches (module doc)."""

    p: float = -0.5
    lambda_n: float = 1.1
    batch: str = "job"
    restart: str = "horizon"
    horizon_s: float = 1800.0
    min_gain: float = 0.1
    weight: str = "none"
    # per-application priors: an ablation (0.92x our sia on philly 1-2, 0.95x without):
    # they read set-ups other jobs ran, which Sia's job does not see
    share: bool = False
    growth: float = 2.0      # a job may grow to growth x the most GPUs it ran (Sia: 2)

    def __post_init__(self) -> None:
        if not self.p < 0:
            raise ConfigError(f"goodput: p must be < 0, got {self.p}")
        if not 1.0 < self.lambda_n < math.inf:
            raise ConfigError(f"goodput: lambda_n must be > 1, got {self.lambda_n}")
        for v, allowed, what in ((self.batch, BATCHES, "batch"),
                                 (self.restart, RESTARTS, "restart"),
                                 (self.weight, WEIGHTS, "weight")):
            if v not in allowed:
                raise ConfigError(f"goodput: {what} {v!r} unknown ({', '.join(allowed)})")
        if not 1 <= self.growth < math.inf:
            raise ConfigError(f"goodput: growth must be >= 1, got {self.growth}")
        if not 0 < self.horizon_s < math.inf or not 0 <= self.min_gain < math.inf:
            raise ConfigError("goodput: horizon must be > 0 and min_gain >= 0 (finite)")


class SharedTypedLearner(TypedLearner):
    """``TypedLearner`` whose per-type learners also pool every job's observations per
    application (``Learner(share=True)``)."""

    def __init__(self, typed_facts: Mapping[str, Mapping[str, AppFacts]]) -> None:
        self.by_type = {t: Learner(dict(f), share=True) for t, f in typed_facts.items()}


@dataclass
class TypedGoodputPolicy(SiaPolicy):
    """``--policy goodput`` on several GPU types (module doc)."""

    options: TypedOptions = field(default_factory=TypedOptions)
    restart_s: Mapping[str, float] = field(default_factory=dict)
    name: str = "goodput"

    def __post_init__(self) -> None:
        o = self.options
        self.p, self.lambda_n = o.p, o.lambda_n
        super().__post_init__()
        if o.share:
            self.tl = SharedTypedLearner({t: {a: AppFacts.of(x) for a, x in apps.items()}
                                          for t, apps in self.typed.items()})

    def _model(self, t: str, v: JobView) -> JobKnowledge | None:
        k = self.tl.by_type[t].jobs.get(v.id)
        if k is not None and k.params is not None and k.grad is not None:
            return self.tl.knowledge(t, v.id, v.app, v.device_type)
        if self.options.share:
            own_grad = None
            for lr in self.tl.by_type.values():
                kk = lr.jobs.get(v.id)
                if kk is not None and kk.grad is not None:
                    own_grad = kk.grad
            pool = self.tl.by_type[t].pools.get(v.app)
            if pool is not None and pool.params is not None and own_grad is not None:
                out = self.tl.by_type[t].job(v.id, v.app).with_prior(pool)
                out.grad = own_grad
                return out
        return None

    def _fitted(self, v: JobView) -> list[str]:
        return [ti.name for ti in self.types if self._model(ti.name, v) is not None]

    def _raw(self, v: JobView, t: str, nodes: np.ndarray, gpus: np.ndarray) -> np.ndarray:
        k = self._model(t, v)
        facts = k.facts
        if self.options.batch == "target" and v.batch:
            facts = replace(facts, max_batch=max(v.batch, facts.init_batch))
        return optimize_batch(k.params, k.grad, facts, nodes, gpus)[0]

    def _cap(self, v: JobView) -> int:
        caps = []
        for ti in self.types:
            k = self._model(ti.name, v)
            prof = k.max_profiled_gpus if k is not None else 0
            f = self.typed[ti.name][v.app]
            caps.append(min(max(int(self.options.growth * prof), 1), 64,
                            int(f.max_batch // f.min_local_bsz)))
        return 1 if v.app == "ncf" else max(caps)

    def goodput_row(self, v: JobView) -> np.ndarray:
        fitted = self._fitted(v)
        cap = self._cap(v)
        row = np.zeros(len(self.configs))
        if not fitted:
            # nothing known but the 1-GPU bootstrap: 1 GPU of each type, valued by it
            for i, (t, _, g) in enumerate(self.configs):
                if g == 1:
                    row[i] = self.xput1[t][v.app]
            row /= row[row > 0].min()
            return np.maximum(row, ZERO_ALLOC_GAIN)
        self._project(v, fitted, cap, row)
        pos = row[row > ZERO_ALLOC_GAIN]
        row = row / (float(pos.min()) if pos.size else 1.0)
        return np.maximum(row, ZERO_ALLOC_GAIN)

    def allocate(self, jobs: Sequence[JobView], capacity: int, now: float
                 ) -> dict[int, Choice]:
        if not jobs:
            return {}
        o = self.options
        n, m = len(jobs), len(self.configs)
        cost = np.zeros((n, m))
        pinned: dict[int, int] = {}
        for i, v in enumerate(jobs):
            row = self.goodput_row(v)
            prev = self._config_of(v)
            if prev is not None:
                keep = row[prev]
                if o.restart == "sia":
                    row = row * self.realloc_factor(v, now)
                else:
                    r = self.restart_s.get(v.app, 30.0)
                    row = row * (o.horizon_s / (o.horizon_s + r)) / (1.0 + o.min_gain)
                row[prev] = keep
                if v.restarting:
                    pinned[i] = prev
            a = np.minimum(np.round(np.power(row, o.p), 2), GOODPUT_CLIP)
            c = a - o.lambda_n
            if o.weight == "las":
                c = c / (1.0 + v.attained / 3600.0)
            cost[i] = c
        x = solve_sia_milp(cost, self.configs, self.types, pinned, self.mip_gap, self.solve_ms)
        out = {}
        for i, v in enumerate(jobs):
            if x[i] < 0:
                out[v.id] = Choice(0, None)
            else:
                t, _, g = self.configs[x[i]]
                out[v.id] = Choice(g, None, device_type=t)
        return out


def make_typed_goodput(typed: Mapping[str, Mapping[str, PolluxApplication]],
                       types: tuple[TypeInfo, ...], options: TypedOptions) -> TypedGoodputPolicy:
    restart = {a: float(x.restart_s) for apps in typed.values() for a, x in apps.items()
               if x.restart_s is not None}
    return TypedGoodputPolicy(typed, types, options=options, restart_s=restart)
