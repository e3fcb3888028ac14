"""Heterogeneity-aware reference policies as the Sia artifact ran them (siasosp23/artifacts,
``sia-simulator/``), in our interval engine on a cluster of several GPU types:

* ``--policy sia`` (``sia.py:SiaPolicy.optimize_mip`` with ``cluster.py``'s job info, run
  with ``--policy_p_val=-0.5 --mip_lambda_n=1.1 --project_throughputs
  --share_max_replicas --interval=60``): per (job, GPU type) a throughput model fitted
  online to the set-ups the job ran on that type (``learned.py``, one ``Learner`` per
  type). A type the job never ran on is priced by *projecting* a fitted type's goodput
  with the ratio of the two types' 1-GPU throughputs (the bootstrap profiles:
  ``Cluster.compute_throughput_ratios``, max per-GPU batch over its step time); a job that
  never ran is offered 1 GPU of any type. Goodputs over the configurations (type, nodes,
  GPUs) of ``CONFIGS_4GPU`` / ``CONFIGS_8GPU`` up to twice the most GPUs profiled on any
  type are normalised to the job's smallest, scaled by Pollux's restart factor off the
  current configuration, raised to p, rounded to 2 decimals, and one MILP per round
  chooses at most one configuration per job, minimising ``sum A x + lambda_n (jobs -
  sum x)`` within each type's GPUs; a job still in checkpoint-restore keeps its
  configuration. Solved with ``scipy.optimize.milp`` (HiGHS) instead of CBC, same 1e-4
  relative gap. lambda_a is accepted by the artifact but unused by its objective.
* ``--policy gavel`` (``gavel.py`` with ``max_sum_throughput_perf``, 360 s rounds): each
  job keeps the trace's GPU count and batch; its steps per second on each type come from
  the *measured* profile (the artifact's ``predict_throughput``, as Sia ran Gavel); the
  LP maximises the sum of throughputs (``scipy.optimize.linprog``, HiGHS, instead of
  ECOS) and rounds give each type's GPUs by ``allocation / time share received``.
* ``--policy pollux`` on such a cluster (``multi_simulator_unaware.py``): Pollux sees one
  homogenised cluster and one throughput model per job over every type it ran on; each
  job then keeps the GPUs of the type that holds most of its allocation (the artifact's
  repair, dropping the rest).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from phalanx.cluster.core.view import Choice, JobView
from phalanx.cluster.model.learned import AppFacts, JobKnowledge, Learner, optimize_batch
from phalanx.cluster.model.profiles import PolluxApplication
from phalanx.cluster.policies.pollux import PolluxPolicy
from phalanx.errors import ConfigError

# ``sia.py``: (nodes, GPUs) a job may get on a type with 4- or 8-GPU nodes
CONFIGS_4GPU = ((1, 1), (1, 2), (1, 4)) + tuple((n, 4 * n) for n in range(2, 17))
CONFIGS_8GPU = ((1, 1), (1, 2), (1, 4), (1, 8)) + tuple((n, 8 * n) for n in range(2, 9))
ZERO_ALLOC_GAIN = 1e-4
GOODPUT_CLIP = 3000.0
# ``sia.py:get_restart_penalty``: seconds a restart costs, per application
SIA_RESTART_PENALTY = {"deepspeech2": 25.0, "imagenet": 250.0, "cifar10": 30.0,
                       "bert": 120.0, "yolov3": 45.0}
# the artifact's cluster order (``simulator_config.cluster_nnodes``): the first fitted type
# in it is the one projected from
SIA_TYPE_ORDER = ("aws", "dgx-ext", "rtx", "azure", "quad", "dgx")
# types kept when a homogenised allocation ties (``fix_allocations_by_dropping``)
UNAWARE_KEEP = {"dgx-ext": 0, "azure": 1, "quad": 2, "rtx": 3, "aws": 4}


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
    """(type, GPUs) of every server -> the types in the artifact's order."""
    by: dict[str, list[int]] = {}
    for t, g in servers:
        by.setdefault(t, []).append(g)
    for t, gs in by.items():
        if len(set(gs)) > 1:
            raise ConfigError(f"GPU type {t}: servers of {sorted(set(gs))} GPUs; the "
                              f"policy needs one server size per type")
    order = sorted(by, key=lambda t: (SIA_TYPE_ORDER.index(t) if t in SIA_TYPE_ORDER
                                      else len(SIA_TYPE_ORDER), t))
    return tuple(TypeInfo(t, by[t][0], len(by[t])) for t in order)


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


@dataclass
class SiaPolicy:
    """``--policy sia``: the Sia artifact's MILP policy (module doc)."""

    typed: Mapping[str, Mapping[str, PolluxApplication]]
    types: tuple[TypeInfo, ...]
    p: float = -0.5
    lambda_n: float = 1.1
    lambda_a: float = 0.01          # accepted, unused (as in the artifact's objective)
    mip_gap: float = 1e-4
    name: str = "sia"
    # each type's 1-GPU throughput per application, when the applications have no
    # measured profile (the live scheduler's jobs: the types' declared speeds); None: from
    # the 1-GPU profile, as the artifact bootstraps
    bootstrap: Mapping[str, Mapping[str, float]] | None = None
    adapts_batch: bool = field(default=True, init=False)
    uses_remaining: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if not self.p < 0:
            raise ConfigError(f"sia: p must be < 0 (its objective is minimised), got {self.p}")
        if not self.lambda_n > 1:
            raise ConfigError(f"sia: lambda_n must be > 1, got {self.lambda_n}")
        self.tl = TypedLearner({t: {a: AppFacts.of(x) for a, x in apps.items()}
                                for t, apps in self.typed.items()})
        self.xput1 = ({t: dict(apps) for t, apps in self.bootstrap.items()}
                      if self.bootstrap is not None else
                      {t: {a: one_gpu_throughput(x) for a, x in apps.items()}
                       for t, apps in self.typed.items()})
        self.configs = [(ti.name, n, g) for ti in self.types for n, g in ti.configs()]
        self.solve_ms: list[float] = []

    def learner_for(self, device_type: str) -> Learner:
        return self.tl.learner_for(device_type)

    # ------------------------------------------------------------------ goodputs
    def _raw(self, v: JobView, t: str, nodes: np.ndarray, gpus: np.ndarray) -> np.ndarray:
        """Goodput at (nodes, GPUs) on type ``t`` from the model fitted there; the job's
        own batch caps the search (``get_speedup_fn``'s max batch = target batch)."""
        k = self.tl.knowledge(t, v.id, v.app, v.device_type)
        facts = k.facts
        if v.batch:
            facts = replace(facts, max_batch=max(v.batch, facts.init_batch))
        return optimize_batch(k.params, k.grad, facts, nodes, gpus)[0]

    def goodput_row(self, v: JobView) -> np.ndarray:
        """The job's normalised goodput on every configuration (ZERO_ALLOC_GAIN where it
        may not run)."""
        fitted = []
        for ti in self.types:
            k = self.tl.by_type[ti.name].jobs.get(v.id)
            if k is not None and k.params is not None and k.grad is not None:
                fitted.append(ti.name)
        caps = {}
        for ti in self.types:
            k = self.tl.by_type[ti.name].jobs.get(v.id)
            prof = k.max_profiled_gpus if k is not None else 0
            f = self.typed[ti.name][v.app]
            caps[ti.name] = min(max(2 * prof, 1), 64, int(f.max_batch // f.min_local_bsz))
        cap = max(caps.values())             # share_max_replicas
        if v.app == "ncf":
            cap = 1
        row = np.full(len(self.configs), 0.0)
        if not fitted:
            for i, (_, _, g) in enumerate(self.configs):
                if g == 1:
                    row[i] = 1.0
            return np.maximum(row, ZERO_ALLOC_GAIN)
        self._project(v, fitted, cap, row)
        pos = row[row > ZERO_ALLOC_GAIN]
        low = float(pos.min()) if pos.size else 1.0
        row = row / low
        return np.maximum(row, ZERO_ALLOC_GAIN)

    def _project(self, v: JobView, fitted: Sequence[str], cap: int, row: np.ndarray) -> None:
        """Fill ``row`` (one value per configuration up to ``cap`` GPUs): a type the job
        has a model of from that model, any other type projected from the first fitted
        one's model times the ratio of the two types' 1-GPU throughputs."""
        src = fitted[0]
        for ti in self.types:
            idx = [i for i, (t, _, g) in enumerate(self.configs) if t == ti.name and g <= cap]
            if not idx:
                continue
            gpus = np.array([self.configs[i][2] for i in idx], dtype=float)
            if ti.name in fitted:
                nodes = np.array([self.configs[i][1] for i in idx], dtype=float)
                vals = self._raw(v, ti.name, nodes, gpus)
            else:
                src_nodes = np.ceil(gpus / next(x.node_gpus for x in self.types
                                                if x.name == src))
                ratio = self.xput1[ti.name][v.app] / self.xput1[src][v.app]
                vals = self._raw(v, src, src_nodes, gpus) * ratio
            row[idx] = vals

    def _config_of(self, v: JobView) -> int | None:
        if not v.gpus or not v.device_type:
            return None
        for i, (t, _, g) in enumerate(self.configs):
            if t == v.device_type and g == v.gpus:
                return i
        return None

    @staticmethod
    def realloc_factor(v: JobView, now: float) -> float:
        """Pollux's restart factor: (age - restarts x penalty) / (age + penalty); 1 for a
        job younger than one penalty."""
        pen = SIA_RESTART_PENALTY.get(v.app, 30.0)
        age = now - v.submit
        if age < pen:
            return 1.0
        return max(age - v.restarts * pen, 0.0) / (age + pen)

    # ------------------------------------------------------------------ the MILP
    def allocate(self, jobs: Sequence[JobView], capacity: int, now: float
                 ) -> dict[int, Choice]:
        if not jobs:
            return {}
        n, m = len(jobs), len(self.configs)
        speed = np.zeros((n, m))
        pinned: dict[int, int] = {}
        for i, v in enumerate(jobs):
            row = self.goodput_row(v)
            prev = self._config_of(v)
            if prev is not None:
                keep = row[prev]
                row = row * self.realloc_factor(v, now)
                row[prev] = keep
                if v.restarting:
                    pinned[i] = prev
            speed[i] = row
        a = np.minimum(np.round(np.power(speed, self.p), 2), GOODPUT_CLIP)
        x = solve_sia_milp(a - self.lambda_n, self.configs, self.types, pinned,
                           self.mip_gap, self.solve_ms)
        out = {}
        for i, v in enumerate(jobs):
            j = x[i]
            if j < 0:
                out[v.id] = Choice(0, None)
            else:
                t, _, g = self.configs[j]
                out[v.id] = Choice(g, None, device_type=t)
        return out

    def finished(self, jid: int) -> None:
        self.tl.forget(jid)


def solve_sia_milp(cost: np.ndarray, configs: Sequence[tuple[str, int, int]],
                   types: Sequence[TypeInfo], pinned: Mapping[int, int], gap: float,
                   times_ms: list[float] | None = None,
                   held: Mapping[str, int] | None = None) -> list[int]:
    """Binary x[job, config]: minimise ``sum cost x`` with at most one configuration per
    job and each type's GPUs, less those ``held`` by jobs outside the MILP (a live
    cluster's jobs that cannot be resized); ``pinned`` jobs keep theirs. The chosen
    configuration per job (-1: none)."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import csr_matrix

    n, m = cost.shape
    t0 = time.perf_counter()
    k = len(types)
    var = np.arange(n * m)
    # rows 0..n-1: one configuration per job; rows n..n+k-1: each type's GPUs
    type_of = np.array([next(i for i, t in enumerate(types) if t.name == c[0])
                        for c in configs])
    gpus = np.array([float(c[2]) for c in configs])
    rows = np.concatenate([var // m, n + type_of[var % m]])
    vals = np.concatenate([np.ones(n * m), gpus[var % m]])
    a = csr_matrix((vals, (rows, np.concatenate([var, var]))), shape=(n + k, n * m))
    held = held or {}
    ub = np.array([1.0] * n + [float(max(t.gpus - held.get(t.name, 0), 0)) for t in types])
    lb = np.zeros(n * m)
    for i, j in pinned.items():
        lb[i * m + j] = 1.0
    res = milp(cost.ravel(), integrality=np.ones(n * m),
               bounds=Bounds(lb, np.ones(n * m)),
               constraints=LinearConstraint(a, -np.inf, ub),
               options={"mip_rel_gap": gap})
    if times_ms is not None:
        times_ms.append((time.perf_counter() - t0) * 1000)
    if res.x is None:
        # the pinned jobs alone overfill a type (cannot happen: they held those GPUs)
        raise RuntimeError(f"sia: MILP has no solution ({res.message})")
    x = np.round(res.x).reshape(n, m)
    return [int(np.argmax(x[i])) if x[i].sum() > 0.5 else -1 for i in range(n)]


# ---------------------------------------------------------------------- Gavel

def _newton(mm: np.ndarray, k: np.ndarray, d: np.ndarray, z: np.ndarray, w: np.ndarray,
            rp: np.ndarray, rd: np.ndarray, rc: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One Newton direction of the interior-point method (normal equations). Near the
    optimum of a degenerate LP some of ``d`` reach 1e-9 and others 1e10, and ``k`` can be
    singular to working precision (Gavel on sia philly 7 hit one at iteration 10): the
    least-squares solution is then the direction."""
    rhs = rp + mm @ (d * rd) - mm @ (rc / w)
    try:
        dy = np.linalg.solve(k, rhs)
    except np.linalg.LinAlgError:
        dy = np.linalg.lstsq(k, rhs, rcond=None)[0]
    dz = d * (mm.T @ dy - rd) + rc / w
    return dz, dy, (rc - w * dz) / z


def lp_interior(c: np.ndarray, a: np.ndarray, b: np.ndarray, tol: float = 1e-8,
                max_iter: int = 100) -> np.ndarray:
    """min c x s.t. a x <= b, x >= 0, by a primal-dual interior-point method (Mehrotra's
    predictor-corrector). Like ECOS, which the artifact's Gavel used, it ends near the
    analytic centre of the optimal face: where optima tie it splits the allocation
    between them, which a simplex vertex (HiGHS) does not (Gavel then time-shares the
    job between those GPU types)."""
    m, n = a.shape
    mm = np.hstack([a, np.eye(m)])                  # a x + slack = b
    cc = np.concatenate([c, np.zeros(m)])
    z, w, y = np.ones(n + m), np.ones(n + m), np.zeros(m)
    nb, nc = 1 + np.linalg.norm(b), 1 + np.linalg.norm(cc)

    def step(v: np.ndarray, dv: np.ndarray) -> float:
        neg = dv < 0
        return min(1.0, float(np.min(-v[neg] / dv[neg]))) if neg.any() else 1.0

    for _ in range(max_iter):
        rp, rd = b - mm @ z, cc - mm.T @ y - w
        mu = float(z @ w) / (n + m)
        if np.linalg.norm(rp) / nb < tol and np.linalg.norm(rd) / nc < tol and mu < tol:
            break
        d = z / w
        k = (mm * d) @ mm.T
        dz, dy, dw = _newton(mm, k, d, z, w, rp, rd, -z * w)
        ap, ad = step(z, dz), step(w, dw)
        mu_aff = float((z + ap * dz) @ (w + ad * dw)) / (n + m)
        sigma = (mu_aff / mu) ** 3
        dz, dy, dw = _newton(mm, k, d, z, w, rp, rd, -z * w - dz * dw + sigma * mu)
        ap, ad = 0.99 * step(z, dz), 0.99 * step(w, dw)
        z, y, w = z + ap * dz, y + ad * dy, w + ad * dw
    return z[:n]


def gavel_throughput(app: PolluxApplication, gpus: int, batch: int, node_gpus: int
                     ) -> float:
    """Steps per second of the job's fixed batch on ``gpus`` packed GPUs of the type
    (``gavel.py:predict_throughput``, read from the measured profile, calibrated)."""
    counts = tuple([node_gpus] * (gpus // node_gpus)
                   + ([gpus % node_gpus] if gpus % node_gpus else []))
    local = math.ceil(batch / gpus - 1e-8)
    accum = math.ceil(local / app.local_limits(counts)[0] - 1e-8) - 1
    if gpus == 1:
        accum = max(1, accum)
    atomic = math.ceil(local / (accum + 1) - 1e-8)
    atomic = min(atomic, int(app.max_batch / (gpus * (accum + 1))))
    step, sync = app.throughput(counts, atomic)
    return 1.0 / (step + (step - sync) * accum) / app.slowdown


@dataclass
class GavelPolicy:
    """``--policy gavel``: max-sum-throughput LP and Gavel's rounds (module doc)."""

    typed: Mapping[str, Mapping[str, PolluxApplication]]
    types: tuple[TypeInfo, ...]
    interval_s: float = 360.0
    # the servers of each type, in server order (Gavel's workers are their GPUs)
    servers: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    lp: str = "interior"         # or "simplex" (HiGHS: a vertex of the optimal face)
    name: str = "gavel"
    adapts_batch: bool = field(default=False, init=False)
    uses_remaining: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.job_time: dict[int, dict[str, float]] = {}
        self.cluster_time = {t.name: 0.0 for t in self.types}
        self._tput: dict[tuple[str, str, int, int], float] = {}
        self._workers: dict[int, tuple[str, tuple[tuple[int, int], ...]]] = {}

    def throughput(self, v: JobView, ti: TypeInfo) -> float:
        g = max(v.requested, 1)
        if g > ti.gpus:
            return 0.1
        key = (ti.name, v.app, g, v.batch)
        hit = self._tput.get(key)
        if hit is None:
            hit = self._tput[key] = gavel_throughput(self.typed[ti.name][v.app], g, v.batch,
                                                     ti.node_gpus)
        return hit

    def allocate(self, jobs: Sequence[JobView], capacity: int, now: float
                 ) -> dict[int, Choice]:
        if not jobs:
            return {}
        from scipy.optimize import linprog

        # the artifact's job order (its active jobs in submission order): equal priorities
        # are common (every job's time share is a multiple of half a round), and the
        # stable sort below breaks them by this order
        jobs = sorted(jobs, key=lambda v: (v.submit, v.id))
        names = [t.name for t in self.types]
        for v in jobs:
            if v.id not in self.job_time:
                self.job_time[v.id] = {t: self.interval_s / 2 for t in names}
                for t in names:
                    self.cluster_time[t] += self.interval_s / 2
        n, k = len(jobs), len(self.types)
        tput = np.array([[self.throughput(v, ti) for ti in self.types] for v in jobs])
        scale = np.array([max(v.requested, 1) for v in jobs], dtype=float)
        a_ub = np.zeros((k + n, n * k))
        for j in range(k):
            a_ub[j, j::k] = scale
        for i in range(n):
            a_ub[k + i, i * k:(i + 1) * k] = 1.0
        b_ub = np.array([t.gpus for t in self.types] + [1.0] * n, dtype=float)
        if self.lp == "interior":
            x = lp_interior(-tput.ravel(), a_ub, b_ub)
        else:
            res = linprog(-tput.ravel(), A_ub=a_ub, b_ub=b_ub, bounds=(0, None),
                          method="highs")
            x = res.x if res.x is not None else np.zeros(n * k)
        x = np.clip(np.round(x, 5), 0, 1).reshape(n, k)
        entries = []
        for j, t in enumerate(names):
            for i, v in enumerate(jobs):
                frac = self.job_time[v.id][t] / self.cluster_time[t] \
                    if self.cluster_time[t] else 0.0
                prio = x[i, j] * 1e9 if frac == 0 or x[i, j] == 0 else x[i, j] / frac
                entries.append((prio, x[i, j], j, i))
        # stable, descending by (priority, deficit 0, allocation)
        entries.sort(key=lambda e: (e[0], e[1]), reverse=True)
        left = {t.name: t.gpus for t in self.types}
        chosen: dict[int, str] = {}
        for _, _, j, i in entries:
            t = names[j]
            if left[t] == 0 or i in chosen or scale[i] > left[t]:
                continue
            left[t] -= int(scale[i])
            chosen[i] = t
        workers = self._assign({jobs[i].id: (t, int(scale[i])) for i, t in chosen.items()})
        out = {}
        for i, v in enumerate(jobs):
            t = chosen.get(i)
            if t is None:
                out[v.id] = Choice(0, None)
                continue
            g = int(scale[i])
            if self.servers:
                per: dict[int, int] = {}
                for s_, _ in workers[v.id]:
                    per[s_] = per.get(s_, 0) + 1
                counts = tuple(per.values())
                servers = tuple(sorted(per.items()))
            else:
                node = next(ti.node_gpus for ti in self.types if ti.name == t)
                counts = tuple([node] * (g // node) + ([g % node] if g % node else []))
                servers = ()
            cfg = self.typed[t][v.app].sia_fixed_config(counts, v.batch)
            out[v.id] = Choice(g, cfg, servers, device_type=t)
            self.job_time[v.id][t] += self.interval_s
            self.cluster_time[t] += self.interval_s
        return out

    def _assign(self, chosen: Mapping[int, tuple[str, int]]
                ) -> dict[int, tuple[tuple[int, int], ...]]:
        """Gavel's workers for each scheduled job (``schedule_jobs_on_workers``): per
        type, by scale factor, largest first; a job that stays on its type keeps its
        workers if none was taken yet; the others take free workers server by server
        from a pointer that only moves forward (so gangs may split across servers)."""
        if not self.servers:
            return {}
        new: dict[int, tuple[tuple[int, int], ...]] = {}
        for ti in self.types:
            jobs = sorted(((jid, g) for jid, (t, g) in chosen.items() if t == ti.name),
                          key=lambda x: -x[1])
            lists = [[(s_, k) for k in range(ti.node_gpus)] for s_ in self.servers[ti.name]]
            taken: set[tuple[int, int]] = set()
            ptr = 0
            for size in sorted({g for _, g in jobs}, reverse=True):
                for jid, g in jobs:
                    prev = self._workers.get(jid)
                    if g == size and prev is not None and prev[0] == ti.name \
                            and len(prev[1]) == g and not taken & set(prev[1]):
                        new[jid] = prev[1]
                        taken |= set(prev[1])
                for jid, g in jobs:
                    if g != size or jid in new:
                        continue
                    mine: list[tuple[int, int]] = []
                    while len(mine) < g and ptr < len(lists):
                        if not lists[ptr]:
                            ptr += 1
                            continue
                        w = lists[ptr].pop(0)
                        if w not in taken:
                            mine.append(w)
                            taken.add(w)
                    if len(mine) != g:
                        raise RuntimeError(f"gavel: could not place job {jid} on {ti.name}")
                    new[jid] = tuple(mine)
        self._workers = {jid: (chosen[jid][0], w) for jid, w in new.items()}
        return new

    def finished(self, jid: int) -> None:
        self.job_time.pop(jid, None)


# ---------------------------------------------------------------------- Pollux, unaware

@dataclass
class UnawarePolluxPolicy(PolluxPolicy):
    """``--policy pollux`` on a cluster of several GPU types (module doc), as
    ``multi_simulator_unaware.py`` builds it: virtual nodes of the smallest server's GPUs
    (an 8-GPU server is two 4-GPU ones), no job above the smallest type's GPUs, Pollux's
    search over them as one type, then each job keeps only the servers of the type that
    holds most of its GPUs. ``node_sizes`` are the virtual nodes'."""

    vnode_server: tuple[int, ...] = ()     # the real server of each virtual node
    server_types: tuple[str, ...] = ()
    max_gpus: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        self.learner.max_gpus = self.max_gpus

    def learner_for(self, device_type: str) -> Learner:
        return self.learner          # one model per job over every type (unaware)

    def allocate(self, jobs: Sequence[JobView], capacity: int, now: float
                 ) -> dict[int, Choice]:
        # the views' placements in virtual nodes: a job's GPUs on a server fill its first
        # virtual node, then the next
        first = {}
        for vn, s_ in enumerate(self.vnode_server):
            first.setdefault(s_, vn)
        size = self.node_sizes[0]
        vjobs = []
        for v in jobs:
            vp = []
            for s_, k in v.placement:
                vn = first[s_]
                while k > 0:
                    vp.append((vn, min(k, size)))
                    k -= size
                    vn += 1
            vjobs.append(replace(v, placement=tuple(vp)))
        out = super().allocate(vjobs, capacity, now)
        fixed = {}
        for jid, c in out.items():
            if not c.servers:
                fixed[jid] = c
                continue
            per_server: dict[int, int] = {}
            for vn, k in c.servers:
                s_ = self.vnode_server[vn]
                per_server[s_] = per_server.get(s_, 0) + k
            per: dict[str, int] = {}
            for s_, k in per_server.items():
                per[self.server_types[s_]] = per.get(self.server_types[s_], 0) + k
            keep = min(per, key=lambda t: (-per[t], UNAWARE_KEEP.get(t, 9), t))
            servers = tuple(sorted((s_, k) for s_, k in per_server.items()
                                   if self.server_types[s_] == keep))
            fixed[jid] = Choice(sum(k for _, k in servers), None, servers, keep)
        return fixed


def unaware_layout(server_sizes: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(virtual node sizes, real server of each virtual node): servers cut into nodes of
    the smallest server's size."""
    size = min(server_sizes)
    sizes, owner = [], []
    for s_, g in enumerate(server_sizes):
        for _ in range(g // size):
            sizes.append(size)
            owner.append(s_)
    return tuple(sizes), tuple(owner)
