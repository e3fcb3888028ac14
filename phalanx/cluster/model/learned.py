"""What a scheduler can *learn* about a job's speed and statistical efficiency from the
set-ups the job has run: Pollux's throughput model, fitted online, and its goodput.

A port of the Pollux artifact (petuum/adaptdl, branch osdi21-artifact):

* ``PerfParams``, the step-time model and ``fit_perf_params``: ``perf_fit.py``;
* ``optimize_batch`` — ``simulator/goodput.py:GoodputFunction.optimize`` (50 geometric
  total batches, the accumulation rule, 1-GPU batches above the initial batch take at
  least one accumulation step);
* ``JobKnowledge`` — the per-job state of ``simulator/simulator.py:Job`` that the policy
  may read: ``profile`` (``update_params``), the gradient statistics *at the current batch
  and epoch only* (``grad_params``), ``max_profiled_replicas`` and the batch a job picks
  for a placement (``update_local_bsz``).

Nothing here reads a measured profile: observations come in through ``observe`` (the
simulator feeds the step it simulated; a live scheduler can feed measured steps).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from phalanx.cluster.model.perf_fit import EPS, PerfParams, fit_perf_params, predict_step_time
from phalanx.cluster.model.profiles import BatchConfig


class Facts(Protocol):
    """What a user declares about a job's application (no speed, no statistics)."""

    name: str
    init_batch: int
    max_batch: int
    min_local_bsz: float
    max_local_bsz: float
    epochs: int


@dataclass(frozen=True)
class AppFacts:
    """What an application declares (as Pollux's jobs do): its initial batch, its batch
    limits, its epochs."""

    name: str
    init_batch: int
    max_batch: int
    min_local_bsz: float
    max_local_bsz: float
    epochs: int

    @classmethod
    def of(cls, app: Facts) -> AppFacts:
        return cls(app.name, int(app.init_batch), int(app.max_batch),
                   float(app.min_local_bsz), float(app.max_local_bsz), int(app.epochs))


# ---------------------------------------------------------------------- goodput

def efficiency(batch: np.ndarray | float, init_batch: float, sqr: float, var: float
               ) -> np.ndarray:
    """Statistical efficiency ``gain / scale`` (``GoodputFunction.efficiency``)."""
    scale = np.asarray(batch, dtype=float) / init_batch
    denom = var / scale + sqr
    gain = np.where(denom > 0, (var + sqr) / np.where(denom > 0, denom, 1.0), 1.0)
    return gain / scale


def optimize_batch(params: PerfParams, grad: tuple[float, float], facts: Facts,
                   nodes: np.ndarray, replicas: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``GoodputFunction.optimize`` with accumulation: for each (nodes, replicas) the best
    (goodput, per-GPU batch, accumulation steps). Goodput is in progress units (iterations
    of the initial batch) per second: ``gain / step time``."""
    nodes = np.asarray(nodes).ravel()
    replicas = np.asarray(replicas).ravel()
    lo, hi = facts.min_local_bsz, facts.max_local_bsz
    min_batch = np.maximum(facts.init_batch, lo * replicas)
    batch = np.geomspace(min_batch, facts.max_batch)        # (50, K)
    local = batch / replicas
    accum = np.ceil(local / hi - EPS) - 1
    accum = np.where((replicas == 1) & (local > facts.init_batch + EPS),
                     np.maximum(accum, 1), accum).astype(int)
    atomic = np.ceil(local / (accum + 1) - EPS).astype(int)
    total = replicas * atomic * (accum + 1)
    t = predict_step_time(params, nodes, replicas, atomic, accum)
    good = efficiency(total, facts.init_batch, *grad) * total / facts.init_batch / t
    good = np.where((lo <= atomic) & (atomic <= hi), good, 0.0)
    best = np.argmax(good, axis=0)
    k = np.arange(good.shape[1])
    return good[best, k], atomic[best, k], accum[best, k]


def fixed_batch_config(facts: Facts, replicas: int, batch: int) -> BatchConfig:
    """A fixed total batch on ``replicas`` GPUs (``Job.update_local_bsz`` with a target
    batch): accumulate beyond the per-GPU limit, and on one GPU above the initial batch."""
    local = math.ceil(batch / replicas - EPS)
    accum = math.ceil(local / facts.max_local_bsz - EPS) - 1
    if replicas == 1 and batch > facts.init_batch:
        accum = max(1, accum)
    atomic = math.ceil(local / (accum + 1) - EPS)
    return BatchConfig(min(atomic, int(facts.max_batch / (replicas * (accum + 1)))), accum,
                       replicas)


class JobKnowledge:
    """What the scheduler knows of one job: the set-ups it ran and their step and sync
    times (``observe``), the model fitted to them (``params``), and the gradient
    statistics at the batch and epoch it runs now (``grad``)."""

    def __init__(self, facts: Facts, target_batch: int = 0,
                 fit: Callable[..., PerfParams] = fit_perf_params) -> None:
        self.facts = facts
        self.target_batch = target_batch       # a fixed batch (the artifact's ncf)
        self.profile: dict[tuple[int, int, float], tuple[float, float]] = {}
        self.params: PerfParams | None = None
        self.grad: tuple[float, float] | None = None
        self.fits = 0
        self._fit = fit

    # -------------------------------------------------------------- observations
    def observe(self, gpus: int, nodes: int, batch: float, step_time: float,
                sync_time: float, replace: bool = False) -> bool:
        """One run set-up: ``gpus`` replicas on ``nodes`` nodes at per-GPU batch
        ``batch``, one step (no accumulation) in ``step_time`` of which ``sync_time`` is
        the gradient sync. Refits when the set-up is new, or with ``replace`` (newer,
        larger evidence of a set-up seen before); True then."""
        key = (int(nodes), int(gpus), float(batch))
        if key in self.profile and not replace:
            return False
        if not (step_time > 0 and 0 <= sync_time < step_time):
            raise ValueError(f"observe: need step_time > sync_time >= 0, got "
                             f"{step_time}, {sync_time}")
        self.profile[key] = (float(step_time), float(sync_time))
        keys = np.array(list(self.profile), dtype=float)
        vals = np.array(list(self.profile.values()))
        self.params = self._fit(keys[:, 0], keys[:, 1], keys[:, 2], vals[:, 0] - vals[:, 1],
                                vals[:, 0])
        self.fits += 1
        return True

    def with_prior(self, pool: JobKnowledge) -> JobKnowledge:
        """A copy that predicts with ``pool``'s model and set-ups (and its gradient
        statistics until this job has its own)."""
        out = copy.copy(self)
        out.params, out.profile = pool.params, pool.profile
        out.grad = self.grad if self.grad is not None else pool.grad
        return out

    def observe_grad(self, sqr: float, var: float) -> None:
        """Gradient statistics measured at the current batch and epoch."""
        self.grad = (float(sqr), float(var))

    # -------------------------------------------------------------- predictions
    @property
    def max_profiled_gpus(self) -> int:
        return max((k[1] for k in self.profile), default=0)

    def growth_cap(self, growth: float = 2.0) -> int:
        """The most GPUs the job may get now: twice (``growth`` x) the most it has run on
        (at least 1), within its batch limits (``get_pollux_job_info``'s
        ``max_replicas``)."""
        f = self.facts
        return max(1, min(max(int(growth * self.max_profiled_gpus), 1), 64,
                          int(f.max_batch // f.min_local_bsz)))

    def predict(self, gpus: int, nodes: int, batch: float, accum: int = 0) -> float:
        """Predicted seconds per step (needs at least one observation)."""
        if self.params is None:
            raise ValueError("predict: no observation yet")
        return float(predict_step_time(self.params, nodes, gpus, batch, accum))

    def goodput(self, nodes: np.ndarray, replicas: np.ndarray) -> np.ndarray:
        """Predicted best goodput (progress per second) at each (nodes, replicas)."""
        if self.params is None or self.grad is None:
            raise ValueError("goodput: no observation yet")
        return optimize_batch(self.params, self.grad, self.facts, nodes, replicas)[0]

    def batch_config(self, nodes: int, replicas: int, max_local: float | None = None,
                     replicas_cap: float | None = None) -> BatchConfig:
        """The batch the job trains on this placement (``Job.update_local_bsz``): the
        target batch if it has one; before any observation the smallest batch that
        feeds every GPU; else the best predicted goodput. ``max_local``: the placement's
        own per-GPU limit (memory; the application's when None); ``replicas_cap``: the
        largest per-GPU batch measured at this many GPUs (Sia's simulator clamps to it)."""
        f = self.facts
        if max_local is not None:
            f = dataclasses.replace(f, max_local_bsz=float(max_local))
        if self.target_batch or self.params is None or self.grad is None:
            batch = self.target_batch or max(f.init_batch, int(f.min_local_bsz * replicas))
            cfg = fixed_batch_config(f, replicas, batch)
            if replicas_cap is None or cfg.atomic <= replicas_cap:
                return cfg
            a, k = int(replicas_cap), cfg.accum
        else:
            _, atomic, accum = optimize_batch(self.params, self.grad, f, np.array([nodes]),
                                              np.array([replicas]))
            a, k = int(atomic[0]), int(accum[0])
            if replicas_cap is not None:
                a = min(a, int(replicas_cap))
        return BatchConfig(min(a, int(f.max_batch / (replicas * (k + 1)))), k, replicas)


# the artifact's two per-application exceptions for Pollux (simulator.py): ncf keeps its
# batch of 32,768 (``Cluster.__init__``) and runs on one GPU (``get_pollux_job_info``)
FIXED_BATCH = {"ncf": 32768}
MAX_GPUS = {"ncf": 1}


class Learner:
    """Every active job's ``JobKnowledge``, created on a job's first observation or
    question. The simulator feeds it after every simulated stretch of training; a live
    scheduler would feed it measured steps. With ``share`` it also fits one model per
    application over every job's observations (finished jobs' included), and a job's
    predictions use it (a prior from similar jobs; Pollux has none)."""

    def __init__(self, facts: dict[str, Facts], share: bool = False, growth: float = 2.0,
                 gammas: tuple[float, ...] = (1.0 + 1e-3,)) -> None:
        self.facts = {k: AppFacts.of(v) for k, v in facts.items()}
        self.jobs: dict[int, JobKnowledge] = {}
        self.share, self.growth, self.gammas = share, growth, gammas
        self.pools: dict[str, JobKnowledge] = {}
        self.max_gpus = 64       # no job grows beyond this (Sia's unaware Pollux: 16)

    def _new(self, app: str, target_batch: int = 0) -> JobKnowledge:
        gammas = self.gammas
        return JobKnowledge(self.facts[app], target_batch,
                            lambda *a: fit_perf_params(*a, gammas=gammas))

    def knowledge(self, jid: int, app: str) -> JobKnowledge:
        """What predictions of job ``jid`` rest on: its own knowledge, or with ``share``
        its application's pooled model (its own gradient statistics when it has any)."""
        own = self.job(jid, app)
        pool = self.pools.get(app)
        if not self.share or pool is None or pool.params is None:
            return own
        return own.with_prior(pool)

    def job(self, jid: int, app: str) -> JobKnowledge:
        k = self.jobs.get(jid)
        if k is None:
            k = self.jobs[jid] = self._new(app, FIXED_BATCH.get(app, 0))
        return k

    def observe(self, jid: int, app: str, gpus: int, nodes: int, batch: float,
                step_time: float, sync_time: float, grad: tuple[float, float],
                replace: bool = False) -> None:
        k = self.job(jid, app)
        k.observe(gpus, nodes, batch, step_time, sync_time, replace)
        k.observe_grad(*grad)
        if self.share:
            pool = self.pools.get(app)
            if pool is None:
                pool = self.pools[app] = self._new(app)
            pool.observe(gpus, nodes, batch, step_time, sync_time, replace)
            pool.observe_grad(*grad)

    def cap(self, jid: int, app: str) -> int:
        return min(self.knowledge(jid, app).growth_cap(self.growth),
                   MAX_GPUS.get(app, self.max_gpus))

    def batch_config(self, jid: int, app: str, nodes: int, replicas: int,
                     max_local: float | None = None, replicas_cap: float | None = None
                     ) -> BatchConfig:
        return self.knowledge(jid, app).batch_config(nodes, replicas, max_local, replicas_cap)

    def forget(self, jid: int) -> None:
        self.jobs.pop(jid, None)
