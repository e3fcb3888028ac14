"""``--policy pollux``: the Pollux artifact's policy run in our interval engine
(petuum/adaptdl osdi21-artifact, ``simulator/pollux.py:PolluxPolicy.optimize`` with the
job information of ``simulator/simulator.py:Cluster.get_pollux_job_info``).

Every interval it builds, per active job (ordered by attained service, then submission,
as the artifact), the speedup function of ``simulator/speedup.py:SpeedupFunction`` from
the throughput model *fitted to the set-ups the job has run* and the gradient statistics
of its current batch and epoch (``learned.py``): goodput at (nodes, GPUs) over goodput at
the fair share (one node, ``ceil(GPUs / jobs)`` GPUs); a job never run assumes linear
speedup. A job may grow to twice the most GPUs it has run on (ncf: one GPU). The search is
``pollux_ga.nsga2``; each job then picks its own batch for its GPUs (``adapts_batch``: the
engine asks ``learner.batch_config`` at every allocation and after every epoch, as
AdaptDL does). It reads no remaining work and no measured profile.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from phalanx.cluster.core.view import Choice, JobView
from phalanx.cluster.model.learned import Facts, Learner
from phalanx.cluster.policies.goodput import greedy
from phalanx.cluster.policies.pollux_ga import RESTART_S, Problem, fronts, nsga2
from phalanx.errors import ConfigError

SEARCHES = ("ga", "greedy")


@dataclass(frozen=True, kw_only=True)
class PolluxOptions:
    """``--policy pollux``'s section (``--pollux-generations``, ``--pollux-search``),
    checked here once."""

    generations: int = 30
    search: str = "ga"          # or "greedy": the same objective, no GA

    def __post_init__(self) -> None:
        if self.search not in SEARCHES:
            raise ConfigError(f"--pollux-search {self.search}: unknown "
                              f"({', '.join(SEARCHES)})")
        if not 1 <= self.generations <= 10000:
            raise ConfigError(f"--pollux-generations must be an integer in 1..10000, "
                              f"got {self.generations}")


@dataclass
class PolluxPolicy:
    """The Pollux artifact's policy: fitted throughput, speedup at the fair share, power-
    mean objective, genetic (or greedy) search."""

    facts: Mapping[str, Facts]
    node_sizes: tuple[int, ...]          # GPUs of each server, server order
    seed: int = 0
    generations: int = 30
    pop_size: int = 100
    search: str = "ga"                   # or "greedy": the same objective, no GA
    restart_s: float = RESTART_S         # the restart delay its penalty counts
    name: str = "pollux"
    adapts_batch: bool = field(default=True, init=False)
    uses_remaining: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        PolluxOptions(generations=self.generations, search=self.search)
        if self.pop_size < 2:
            raise ConfigError(f"pollux: the population must be >= 2, got {self.pop_size}")
        self.learner = Learner(dict(self.facts))
        self._rng = np.random.default_rng(self.seed)
        self._prev: tuple[np.ndarray, list[int]] | None = None
        self._tables: dict[int, tuple[object, np.ndarray]] = {}

    # ------------------------------------------------------------------ speedups
    def _table(self, v: JobView, cap: int, fair: int, width: int) -> np.ndarray:
        """(3 x width) speedups over (no / one / several nodes, GPUs)."""
        k = self.learner.job(v.id, v.app)
        key = (k.params, k.grad, cap, fair)
        hit = self._tables.get(v.id)
        if hit is not None and hit[0] == key:
            return hit[1]
        t = np.zeros((3, width))
        r = np.arange(1, cap + 1)
        if k.params is None or k.grad is None:
            t[1:, 1:cap + 1] = r / fair            # linear speedup before the first run
        else:
            base = float(k.goodput(np.array([1]), np.array([fair]))[0])
            if not base > 0:
                base = float(k.goodput(np.array([1]), np.array([1]))[0]) * fair
            t[1, 1:cap + 1] = k.goodput(np.ones_like(r), r) / base
            if cap >= 2:
                t[2, 2:cap + 1] = k.goodput(np.full(cap - 1, 2), r[1:]) / base
        self._tables[v.id] = (key, t)
        return t

    # ------------------------------------------------------------------ allocation
    def allocate(self, jobs: Sequence[JobView], capacity: int, now: float, *,
                 held: Mapping[str, int] | None = None) -> dict[int, Choice]:
        if not jobs:
            return {}
        order = sorted(jobs, key=lambda j: (j.attained, j.submit, j.id))
        ids = [j.id for j in order]
        sizes = np.array(self.node_sizes)
        n_nodes, width = len(sizes), capacity + 1
        fair = math.ceil(capacity / len(order))
        base = np.zeros((len(order), n_nodes), dtype=np.int64)
        caps = np.zeros(len(order), dtype=np.int64)
        tables = np.zeros((len(order), 3, width))
        for i, v in enumerate(order):
            for s, k in v.placement:
                base[i, s] += k
            caps[i] = min(self.learner.cap(v.id, v.app), capacity)
            tables[i] = self._table(v, int(caps[i]), fair, width)
        restarts = np.array([v.restarts for v in order], dtype=float)
        age = np.array([now - v.submit for v in order])
        problem = Problem(tables, base, caps, restarts, age, sizes, self.restart_s)
        if self.search == "greedy":
            return self._greedy(order, problem, capacity)
        pop, f = nsga2(problem, self._initial(ids, base), self._rng, self.pop_size,
                       self.generations)
        self._prev = (pop, ids)
        front = np.flatnonzero(fronts(f) == 0)
        best = pop[front[np.argmin(f[front, 0])]]
        live = set(ids)
        for jid in [j for j in self._tables if j not in live]:
            del self._tables[jid]
        out = {}
        for i, v in enumerate(order):
            servers = tuple((int(s), int(best[i, s])) for s in np.flatnonzero(best[i]))
            out[v.id] = Choice(int(best[i].sum()), None, servers)
        return out

    def _greedy(self, order: list[JobView], problem: Problem, capacity: int
                ) -> dict[int, Choice]:
        """The artifact's objective without its GA: the power mean with p = -1 is
        ``jobs / sum(1 / scaled speedup)``, so maximising it is a sum over jobs, and
        ``goodput.greedy`` gives GPUs where ``1 / s(current) - 1 / s(n)`` per added GPU
        is largest (counts 1..node, then whole nodes, packed; the restart penalty applies
        to a job whose count changes). A job that keeps its count keeps its nodes."""
        node = int(max(self.node_sizes))
        index = {v.id: i for i, v in enumerate(order)}

        def value(j: JobView, n: int) -> float:
            i = index[j.id]
            s = problem.tables[i, 0 if n == 0 else (1 if n <= node else 2), n]
            s *= problem.scale
            if n != j.gpus:
                s *= problem.penalty[i]
            return -1.0 / (s + 1e-3)

        allowed = {}
        for i, v in enumerate(order):
            cap = int(problem.max_replicas[i, 0])
            allowed[v.id] = (list(range(1, min(node, cap) + 1))
                             + list(range(2 * node, cap + 1, node)))
        level = greedy(order, capacity, allowed, value)
        return {v.id: Choice(level[v.id], None, v.placement if level[v.id] == v.gpus else ())
                for v in order}

    def _initial(self, ids: list[int], base: np.ndarray) -> np.ndarray:
        """The last call's final population for the jobs still here (new jobs hold
        nothing), or the current allocation alone (``_adapt_prev_states``)."""
        if self._prev is None:
            return base[None].copy()
        prev, prev_ids = self._prev
        where = {j: i for i, j in enumerate(prev_ids)}
        states = np.zeros((len(prev), *base.shape), dtype=np.int64)
        for i, j in enumerate(ids):
            if j in where:
                states[:, i] = prev[:, where[j]]
        return states

    def learner_for(self, device_type: str) -> Learner:
        return self.learner      # one model per job (its speedup over the cluster)

    def finished(self, jid: int) -> None:
        self.learner.forget(jid)
