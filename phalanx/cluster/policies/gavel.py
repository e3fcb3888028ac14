"""``--policy gavel`` as the Sia artifact ran it (siasosp23/artifacts, ``sia-simulator/``
``gavel.py`` with ``max_sum_throughput_perf``, 360 s rounds), in our interval engine on a
cluster of several GPU types: each job keeps the trace's GPU count and batch; its steps per
second on each type come from the *measured* profile (the artifact's
``predict_throughput``, as Sia ran Gavel); the LP maximises the sum of throughputs (an
interior-point method ending where ECOS, the artifact's solver, ends; or
``scipy.optimize.linprog``, HiGHS) and rounds give each type's GPUs by ``allocation / time
share received``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from phalanx.cluster.core.view import Choice, JobView
from phalanx.cluster.model.profiles import PolluxApplication
from phalanx.cluster.policies.typed_base import TypeInfo


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

    def allocate(self, jobs: Sequence[JobView], capacity: int, now: float, *,
                 held: Mapping[str, int] | None = None) -> dict[int, Choice]:
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
        # a type's GPUs that jobs outside the policy hold are nobody's to give
        held = held or {}
        gpus = {t.name: max(t.gpus - held.get(t.name, 0), 0) for t in self.types}
        b_ub = np.array([gpus[t.name] for t in self.types] + [1.0] * n, dtype=float)
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
        left = dict(gpus)
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

    def learner_for(self, device_type: str) -> None:
        return None      # it reads each type's measured profile, as Sia ran Gavel

    def finished(self, jid: int) -> None:
        self.job_time.pop(jid, None)
