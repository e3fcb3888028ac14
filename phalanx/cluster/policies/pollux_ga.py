"""The Pollux artifact's allocation search (petuum/adaptdl osdi21-artifact,
``simulator/pollux.py``: ``Problem`` and ``PolluxPolicy.optimize``), without pymoo.

A state is a (jobs x nodes) array of GPUs. Its objectives, as ``Problem._evaluate``:
the power mean (p = -1) of each job's speedup scaled so that one node's share is 1,
times ``max(age - restarts x 30, 0) / (age + 30)`` for a job whose row changes (the
restart penalty), and the cluster utility (``get_cluster_utilities``). The artifact runs
pymoo's NSGA-II (population 100, 100 generations) with its own crossover (one point over
jobs), mutation (reset to the current allocation, zero out, grow into free GPUs) and
repair (one distributed job per node, per-job GPU limit, node capacity with the jobs of
least attained service first), seeded with the last call's final population, and takes the
Pareto-front state of the best power mean. ``NSGA2`` below is a numpy re-implementation of
that loop (binary tournament by domination then crowding, crossover probability 0.9,
duplicate elimination, rank-and-crowding survival), seeded, so runs are reproducible.
"""

from __future__ import annotations

import bisect

import numpy as np

P_MEAN = -1.0          # the artifact's fairness exponent
RESTART_S = 30.0       # its restart delay in the penalty
CROSSOVER_PROB = 0.9   # pymoo's default
MAX_MATING_TRIES = 100  # pymoo's n_max_iterations for unique offspring


class Problem:
    """One allocation problem. ``tables[j, c, r]``: job j's speedup on r GPUs over c nodes
    (c = 0 none, 1 one node, 2 several: the model only tells one from several)."""

    def __init__(self, tables: np.ndarray, base: np.ndarray, max_replicas: np.ndarray,
                 restarts: np.ndarray, age: np.ndarray, node_gpus: np.ndarray,
                 restart_s: float = RESTART_S) -> None:
        self.tables, self.base = tables, base
        self.max_replicas = max_replicas.reshape(-1, 1)
        self.node_gpus = node_gpus
        self.n_jobs, self.n_nodes = base.shape
        # one GPU per replica: the dominant share of a replica is 1 / cluster GPUs
        share = 1.0 / node_gpus.sum()
        self.scale = share * self.n_nodes
        # the restart delay: the artifact's 30 s, or the engine's declared restart cost
        self.penalty = np.maximum(age - restarts * restart_s, 0.0) / (age + restart_s)

    def speedups(self, states: np.ndarray) -> np.ndarray:
        nodes = np.minimum(np.count_nonzero(states, axis=2), 2)
        reps = np.minimum(states.sum(axis=2), self.tables.shape[2] - 1)
        return self.tables[np.arange(self.n_jobs), nodes, reps]

    def evaluate(self, states: np.ndarray) -> np.ndarray:
        """(pop x 2) objectives to minimise: -power mean, -cluster utility."""
        sp = self.speedups(states)
        scaled = sp * self.scale
        restart = np.any(states != self.base, axis=2)
        scaled = scaled * np.where(restart, self.penalty, 1.0)
        mean = (np.sum((scaled + 1e-3) ** P_MEAN, axis=1) / self.n_jobs) ** (1.0 / P_MEAN)
        reps = states.sum(axis=2)
        active = states.sum(axis=1) > 0
        total = (active * self.node_gpus).sum(axis=1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            shares = np.where(reps > 0, reps / total, 0.0)
            util = np.where(reps > 0, sp / reps, 0.0)
        return np.column_stack([-mean, -(util * shares).sum(axis=1)])

    # ------------------------------------------------------------------ operators
    def crossover(self, rng: np.random.Generator, a: np.ndarray, b: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
        """One point over jobs (``Problem._crossover``): the first jobs swap parents."""
        n = len(a)
        points = rng.integers(self.n_jobs, size=(n, 1))
        m = (np.arange(self.n_jobs) < points)[:, :, None]
        c1, c2 = np.where(m, b, a), np.where(m, a, b)
        keep = rng.random(n) >= CROSSOVER_PROB          # no crossover for this mating
        c1[keep], c2[keep] = a[keep], b[keep]
        return c1, c2

    def mutate(self, rng: np.random.Generator, states: np.ndarray) -> np.ndarray:
        """``Problem._mutation``."""
        p, j, n = states.shape
        reset = rng.random((p, j)) < 0.1
        states = np.where(reset[:, :, None], self.base, states)
        prob = np.where(rng.random((p, j)) < 0.1, 0.1, 0.0)
        states[rng.random(states.shape) < prob[:, :, None]] = 0
        free = self.node_gpus - states.sum(axis=1)                   # (p, n)
        mask1 = np.broadcast_to((free >= 1)[:, None, :], states.shape)
        prob1 = mask1 / np.maximum(mask1.sum(axis=1, keepdims=True), 1.0)
        mask2 = (states > 0) & mask1
        prob2 = mask2 / np.maximum(mask2.sum(axis=1, keepdims=True), 1.0)
        m = rng.random(states.shape) < prob1 + prob2 - prob1 * prob2
        r = rng.integers(states, self.node_gpus[None, None, :] + 1)
        states[m] = r[m]
        return states

    def repair(self, rng: np.random.Generator, states: np.ndarray) -> np.ndarray:
        """``Problem._repair``: one distributed job per node, per-job GPU limit (nodes
        taken in random order), at most 16 nodes per job, node capacity in job order."""
        states = states.copy()
        distributed = np.count_nonzero(states, axis=2) > 1
        mask = (states * distributed[:, :, None]) > 0
        states[mask.cumsum(axis=1) > 1] = 0
        shuffle = np.argsort(rng.random(states.shape), axis=2)
        states = np.take_along_axis(states, shuffle, axis=2)
        states = np.diff(np.minimum(np.cumsum(states, axis=2), self.max_replicas[None]),
                         axis=2, prepend=0)
        used = np.diff(np.minimum(np.cumsum(states > 0, axis=2), 16), axis=2, prepend=0)
        states[used == 0] = 0
        states = np.take_along_axis(states, np.argsort(shuffle, axis=2), axis=2)
        states = np.diff(np.minimum(np.cumsum(states, axis=1), self.node_gpus), axis=1,
                         prepend=0)
        return states


# ---------------------------------------------------------------------- NSGA-II

def _dominates(fa: np.ndarray, fb: np.ndarray) -> np.ndarray:
    return np.all(fa <= fb, axis=-1) & np.any(fa < fb, axis=-1)


def fronts(f: np.ndarray) -> np.ndarray:
    """Non-dominated rank of each point (0 = the Pareto front) of two objectives: a sweep
    in (f0, f1) order puts each point in the first front none of whose points dominates
    it; inside a front f1 only falls, so its last point is the one to compare with."""
    order = np.lexsort((f[:, 1], f[:, 0]))
    rank = np.empty(len(f), dtype=int)
    last: list[tuple[float, float]] = []      # (f0, f1) of each front's last point
    f1s: list[float] = []                     # their f1: never decreasing with the front
    for i in order:
        p = (float(f[i, 0]), float(f[i, 1]))
        k = bisect.bisect_left(f1s, p[1])
        # a front whose last point has p's f1 and a smaller f0 dominates p; p's duplicate
        # does not
        while k < len(f1s) and f1s[k] == p[1] and last[k] != p:
            k += 1
        if k == len(last):
            last.append(p)
            f1s.append(p[1])
        else:
            last[k] = p
            f1s[k] = p[1]
        rank[i] = k
    return rank


def crowding(f: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Crowding distance of each point inside its front (a front's boundary points and
    fronts of at most 2 points: infinite)."""
    n, m = f.shape
    out = np.zeros(n)
    for k in range(m):
        order = np.lexsort((f[:, k], rank))
        v, r = f[order, k], rank[order]
        start = np.r_[True, r[1:] != r[:-1]]
        end = np.r_[r[1:] != r[:-1], True]
        group = np.cumsum(start) - 1
        lo, hi = v[start], v[end]
        span = (hi - lo)[group]
        d = np.full(n, np.inf)
        inner = ~start & ~end
        idx = np.flatnonzero(inner)
        with np.errstate(divide="ignore", invalid="ignore"):
            d[idx] = np.where(span[idx] > 0, (v[idx + 1] - v[idx - 1]) / span[idx], 0.0)
        out[order] += d
    return out / m


def survive(f: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices of the ``n`` survivors by rank then crowding; their ranks and crowding."""
    rank = fronts(f)
    crowd = crowding(f, rank)
    order = np.lexsort((-crowd, rank))[:n]
    return order, rank[order], crowd[order]


def _unique_rows(states: np.ndarray, seen: set[bytes]) -> np.ndarray:
    keep = []
    for i, s in enumerate(states):
        key = s.tobytes()
        if key not in seen:
            seen.add(key)
            keep.append(i)
    return np.array(keep, dtype=int)


def nsga2(problem: Problem, init: np.ndarray, rng: np.random.Generator,
          pop_size: int = 100, generations: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """The final population and its objectives."""
    seen: set[bytes] = set()
    pop = problem.repair(rng, init)
    pop = pop[_unique_rows(pop, seen)]
    f = problem.evaluate(pop)
    idx, rank, crowd = survive(f, len(pop))
    pop, f = pop[idx], f[idx]
    for _ in range(generations - 1):
        # offspring must differ from the population and from each other (pymoo's
        # duplicate elimination); a state dropped earlier may come back
        seen = {s.tobytes() for s in pop}
        off, tries = [], 0
        need = pop_size
        while need > 0 and tries < MAX_MATING_TRIES:
            tries += 1
            n_mate = (need + 1) // 2
            picks = np.concatenate([rng.permutation(len(pop))
                                    for _ in range(-(-4 * n_mate // len(pop)))])[:4 * n_mate]
            a, b = picks[0::2], picks[1::2]
            a_dom, b_dom = _dominates(f[a], f[b]), _dominates(f[b], f[a])
            by_crowd = np.where(crowd[a] == crowd[b], rng.random(len(a)) < 0.5,
                                crowd[a] > crowd[b])
            win = np.where(a_dom, a, np.where(b_dom, b, np.where(by_crowd, a, b)))
            c1, c2 = problem.crossover(rng, pop[win[0::2]], pop[win[1::2]])
            kids = problem.repair(rng, problem.mutate(rng, np.concatenate([c1, c2])))
            kids = kids[_unique_rows(kids, seen)][:need]
            if len(kids):
                off.append(kids)
                need -= len(kids)
        if not off:
            break
        merged = np.concatenate([pop, *off])
        fm = np.concatenate([f, problem.evaluate(np.concatenate(off))])
        idx, rank, crowd = survive(fm, pop_size)
        pop, f = merged[idx], fm[idx]
    return pop, f
