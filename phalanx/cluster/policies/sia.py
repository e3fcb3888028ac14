"""The heterogeneity-aware Sia policy as its artifact ran it (siasosp23/artifacts,
``sia-simulator/``), in our interval engine on a cluster of several GPU types.

``--policy sia`` (``sia.py:SiaPolicy.optimize_mip`` with ``cluster.py``'s job info, run
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

The Gavel reference is in :mod:`gavel`, the heterogeneity-unaware Pollux in
:mod:`pollux_unaware`; what they share with this one (types, configurations, one learner
per type) in :mod:`typed_base`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from phalanx.cluster.core.view import Choice, JobView
from phalanx.cluster.model.learned import AppFacts, Learner, optimize_batch
from phalanx.cluster.model.profiles import PolluxApplication
from phalanx.cluster.policies.typed_base import (
    GOODPUT_CLIP,
    ZERO_ALLOC_GAIN,
    TypedLearner,
    TypeInfo,
    one_gpu_throughput,
)
from phalanx.errors import ConfigError

# ``sia.py:get_restart_penalty``: seconds a restart costs, per application
SIA_RESTART_PENALTY = {"deepspeech2": 25.0, "imagenet": 250.0, "cifar10": 30.0,
                       "bert": 120.0, "yolov3": 45.0}


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

    def learner_for(self, device_type: str) -> Learner | None:
        """The job's model on ``device_type``; none before it runs on a type (what a job
        measures is a type's), but on a cluster of one type, that type's (an engine that
        does not name types: a homogeneous simulated cluster)."""
        if not device_type and len(self.types) == 1:
            device_type = self.types[0].name
        return self.tl.learner_for(device_type) if device_type else None

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
    def allocate(self, jobs: Sequence[JobView], capacity: int, now: float, *,
                 held: Mapping[str, int] | None = None) -> dict[int, Choice]:
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
                           self.mip_gap, self.solve_ms, held=held)
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


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """HiGHS 1.12 prints ``HighsMipSolverData::transformNewIntegerFeasibleSolution
    tmpSolver.run();`` to the process's stdout from C++, whatever its options say
    (ERGO-Code/HiGHS#2783): a run's output got a line of it every few rounds on Pollux's
    workloads. File descriptor 1, C's stdout, points at /dev/null while the solver runs."""
    fd = 1
    with contextlib.suppress(AttributeError, OSError, ValueError):
        sys.stdout.flush()          # what Python wrote before goes out first
    try:
        saved = os.dup(fd)
    except OSError:                 # no fd 1 at all: nothing to keep clean
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(null)


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
    with _quiet_stdout():
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
