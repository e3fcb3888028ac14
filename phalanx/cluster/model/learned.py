"""What a scheduler can *learn* about a job's speed and statistical efficiency from the
set-ups the job has run: Pollux's throughput model, fitted online, and its goodput.

A port of the Pollux artifact (petuum/adaptdl, branch osdi21-artifact):

* ``PerfParams`` and the step-time model — ``simulator/goodput.py``: ``PerfParams``,
  ``_predict_accum_time``, ``_predict_network_time``, ``_predict_log_optim_time``;
* ``fit_perf_params`` — ``simulator/goodput.py:fit_perf_params`` (same objective: RMSLE of
  the compute and step times + the two regularisers; same start, bounds and the same
  parameters pinned when no observation can inform them; L-BFGS-B; the prior that
  inter-node network terms are at least 1.1x the intra-node ones). The artifact takes the
  gradient with ``autograd``; here it is written out (``_objective``) and checked against
  finite differences in the tests;
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
from typing import NamedTuple, Protocol

import numpy as np
from threadpoolctl import threadpool_limits

from phalanx.cluster.model.profiles import BatchConfig

EPS = 1e-8


class PerfParams(NamedTuple):
    """Step time = ``(T_c^g + T_n^g)^(1/g)`` + accumulation steps x T_c, with
    ``T_c = alpha_c + beta_c x per-GPU batch`` and ``T_n = alpha + beta x max(replicas - 2,
    0)`` of the slowest link (inter-node ``_n``, intra-node ``_r``; none on one GPU)."""

    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float


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


# ---------------------------------------------------------------------- the model

def _network(p: np.ndarray, nodes: np.ndarray, replicas: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Network time and the masks (inter-node, intra-node) that select its terms."""
    inter = nodes > 1
    intra = ~inter & (replicas > 1)
    m = np.maximum(replicas - 2, EPS)
    alpha = np.where(inter, p[2], np.where(intra, p[4], EPS))
    beta = np.where(inter, p[3], np.where(intra, p[5], EPS))
    return alpha + beta * m, inter, intra


def predict_step_time(params: PerfParams, nodes: np.ndarray | int,
                      replicas: np.ndarray | int, atomic: np.ndarray | float,
                      accum: np.ndarray | int = 0) -> np.ndarray:
    """Seconds per (accumulated) step: ``accum x T_c + (T_c^g + T_n^g)^(1/g)``."""
    p = np.asarray(params, dtype=float)
    nodes, replicas = np.asarray(nodes), np.asarray(replicas)
    t_c = p[0] + p[1] * np.asarray(atomic, dtype=float)
    t_n, _, _ = _network(p, nodes, replicas)
    g = p[6]
    optim = np.exp(np.log(t_c ** g + t_n ** g) / g)
    return np.asarray(accum) * t_c + optim


def _objective(x: np.ndarray, nodes: np.ndarray, replicas: np.ndarray, atomic: np.ndarray,
               accum_t: np.ndarray, optim_t: np.ndarray) -> tuple[float, np.ndarray]:
    """The artifact's ``_obj_fn`` and its gradient."""
    n = len(nodes)
    grad = np.zeros(7)
    t_c = x[0] + x[1] * atomic
    t_n, inter, intra = _network(x, nodes, replicas)
    g = x[6]
    e1 = np.log(t_c) - np.log(accum_t)
    err1 = math.sqrt(float(np.mean(e1 ** 2)))
    s = t_c ** g + t_n ** g
    log_opt = np.log(s) / g
    e2 = log_opt - np.log(optim_t)
    err2 = math.sqrt(float(np.mean(e2 ** 2)))
    reg1 = 1e-3 * (g - 1) ** 2
    reg2 = 1e-2 * ((x[3] / x[2]) ** 2 + (x[5] / x[4]) ** 2)
    # d err1 / d t_c and d err2 / d log_opt (0 at an exact fit, where sqrt has no slope)
    d1 = e1 / (n * err1) / t_c if err1 > 0 else np.zeros(n)
    d2 = e2 / (n * err2) if err2 > 0 else np.zeros(n)
    dlo_dtc = t_c ** (g - 1) / s
    dlo_dtn = t_n ** (g - 1) / s
    dtc = d1 + d2 * dlo_dtc
    grad[0] = dtc.sum()
    grad[1] = (dtc * atomic).sum()
    dtn = d2 * dlo_dtn
    m = np.maximum(replicas - 2, EPS)
    grad[2] = dtn[inter].sum()
    grad[3] = (dtn * m)[inter].sum()
    grad[4] = dtn[intra].sum()
    grad[5] = (dtn * m)[intra].sum()
    dlo_dg = -np.log(s) / g ** 2 + (t_c ** g * np.log(t_c) + t_n ** g * np.log(t_n)) / (s * g)
    grad[6] = (d2 * dlo_dg).sum() + 2e-3 * (g - 1)
    grad[2] += -2e-2 * x[3] ** 2 / x[2] ** 3
    grad[3] += 2e-2 * x[3] / x[2] ** 2
    grad[4] += -2e-2 * x[5] ** 2 / x[4] ** 3
    grad[5] += 2e-2 * x[5] / x[4] ** 2
    return err1 + err2 + reg1 + reg2, grad


def fit_perf_params(nodes: np.ndarray, replicas: np.ndarray, atomic: np.ndarray,
                    accum_time: np.ndarray, step_time: np.ndarray,
                    gammas: tuple[float, ...] = (1.0 + 1e-3,)) -> PerfParams:
    """``simulator/goodput.py:fit_perf_params``: fit the 7 parameters to observed compute
    (``accum_time`` = step - sync) and step times. ``gammas``: the overlap exponent's
    start values; the artifact starts from 1.001 only (L-BFGS-B then often stops near
    it); more starts keep the best objective (an ablation of ours)."""
    nodes, replicas = np.asarray(nodes), np.asarray(replicas)
    atomic = np.asarray(atomic, dtype=float)
    accum_time, step_time = np.asarray(accum_time, float), np.asarray(step_time, float)
    x0 = [1e-1, 1e-2] * 3 + [1.0 + 1e-3]
    lower = [1e-8, 1e-8] * 3 + [1.0]
    upper = [np.inf, np.inf] * 3 + [10.0]
    if len(np.unique(atomic)) == 1:
        # one per-GPU batch seen: split the compute time evenly between the constant and
        # the per-sample term (optimistic about larger batches), as the artifact does
        x0[0] = upper[0] = lower[0] = float(np.mean(accum_time)) / 2
    if not np.any(nodes > 1):
        x0[2] = upper[2] = lower[2]
        x0[3] = upper[3] = lower[3]
    if not np.any((nodes == 1) & (replicas > 1)):
        x0[4] = upper[4] = lower[4]
        x0[5] = upper[5] = lower[5]
    if not np.any(replicas > 2):
        x0[3] = upper[3] = lower[3]
        x0[5] = upper[5] = lower[5]
    import scipy.optimize  # noqa: PLC0415 - ~0.8 s at import: every CLI would pay it

    # one thread: L-BFGS-B's BLAS pool spinning on a loaded 2-core machine made each
    # iteration cost ~0.6 ms instead of microseconds
    best = None
    with threadpool_limits(1):
        for g0 in gammas:
            x0[6] = g0
            res = scipy.optimize.minimize(_objective, np.array(x0), jac=True,
                                          method="L-BFGS-B", bounds=list(zip(lower, upper)),
                                          args=(nodes, replicas, atomic, accum_time,
                                                step_time))
            if best is None or res.fun < best.fun:
                best = res
    p = best.x.copy()
    if not np.any(nodes > 1):
        # prior: crossing nodes costs at least what staying on one does
        p[2] = max(p[2], p[4] * 1.1)
        p[3] = max(p[3], p[5] * 1.1)
    return PerfParams(*(float(v) for v in p))


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
