"""Elastic, goodput-driven allocation on the *measured* profiles (``--profiles oracle``:
an ablation, since no scheduler knows them; the default, on learned profiles, is
``goodput_typed.py``). The scheduler chooses each job's GPU count AND its total batch
size (per-GPU batch x accumulation steps), every interval.

* goodput(job, n GPUs, batch) = throughput x statistical efficiency, in progress units
  (iterations at the application's initial batch) per second:
  ``gain(batch, epoch) / step_time(placement, per-GPU batch, accumulation)`` with the
  measured step times (placements / scalability profiles, accumulation when the batch
  does not fit) and ``gain = (var + sqr) / (var / scale + sqr)`` from the validation
  files' gradient statistics. For each (application, epoch, n) the best batch within the
  application's limits is searched over per-GPU batches x accumulation steps.
* allocation: ``greedy`` on marginal value per GPU. A job's value at n GPUs is
  ``w x goodput(n)``, times ``T / (T + restart_s)`` when n is not its current count (a
  change restarts the job; T = the horizon, or with ``srpt`` its remaining time if
  shorter). With ``priority="srpt"`` (the only priority that reads remaining work, from
  the epochs users declare) the weight is 1 / the job's remaining progress, so the value
  is 1 / (its remaining time at n GPUs, restart included). ``"las"`` weighs by 1 /
  (attained GPU-seconds + one GPU-hour); ``"none"`` (default) maximises total goodput.
  Each step adds to one job the GPU block (next allowed count: 1-4 on one node, then whole
  nodes) with the best value per added GPU; a heap keeps each job's best block, so a round
  costs O((jobs + GPUs) x counts) lookups, all cached.

Policies read ``JobView`` snapshots and never write them.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from phalanx.cluster.core.view import Choice, JobView
from phalanx.cluster.model.profiles import BatchConfig, PolluxApplication
from phalanx.errors import ConfigError

PRIORITIES = ("srpt", "las", "none")


PROFILES = ("learned", "oracle")
BATCHES = ("adaptive", "fixed")


@dataclass(frozen=True, kw_only=True)
class GoodputOptions:
    """The goodput policies' section, learned and oracle alike (``--goodput-priority``,
    ``--goodput-horizon``, ``--goodput-batch``, ``--profiles``), checked here once."""

    priority: str = "none"
    horizon_s: float = 1800.0
    batch: str = "adaptive"     # or "fixed": each job keeps its own batch (ablation)
    # what the policy knows of throughput: "learned" (fitted to the set-ups each job has
    # run, as Pollux) or "oracle" (every measured profile: an ablation)
    profiles: str = "learned"

    def __post_init__(self) -> None:
        if self.priority not in PRIORITIES:
            raise ConfigError(f"--goodput-priority {self.priority}: unknown (choose from "
                              f"{', '.join(PRIORITIES)})")
        if not 0 < self.horizon_s < math.inf:
            raise ConfigError(f"--goodput-horizon must be a finite number > 0 seconds, "
                              f"got {self.horizon_s}")
        if self.batch not in BATCHES:
            raise ConfigError(f"--goodput-batch {self.batch}: unknown (choose from "
                              f"{', '.join(BATCHES)})")
        if self.profiles not in PROFILES:
            raise ConfigError(f"--profiles {self.profiles}: unknown (choose from "
                              f"{', '.join(PROFILES)})")


def check_goodput_flags(priority: str, horizon_s: float) -> None:
    """The goodput policies' own flags (learned and oracle alike): their section's check."""
    GoodputOptions(priority=priority, horizon_s=horizon_s)


def packed_counts(n: int, node_gpus: int) -> tuple[int, ...]:
    """n GPUs on as few ``node_gpus``-GPU nodes as possible."""
    return tuple([node_gpus] * (n // node_gpus) + ([n % node_gpus] if n % node_gpus else []))


@dataclass(frozen=True)
class GoodputPolicy:
    """The oracle goodput policy (``--profiles oracle``, an ablation): GPUs and batch per
    job from every measured profile."""

    apps: Mapping[str, PolluxApplication]
    node_gpus: int = 4
    restart_s: float = 30.0
    horizon_s: float = 1800.0      # a change must pay its restart back within this
    priority: str = "none"
    max_accum: int = 7
    fixed_batch: bool = False      # ablation: keep each job's own batch, choose GPUs only
    name: str = "goodput"
    _best: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def uses_remaining(self) -> bool:
        return self.priority == "srpt"

    @property
    def adapts_batch(self) -> bool:
        return False

    def learner_for(self, device_type: str) -> None:
        return None      # it reads every measured profile (the oracle ablation)

    def finished(self, jid: int) -> None:
        """Nothing kept per job beyond the round."""

    def __post_init__(self) -> None:
        check_goodput_flags(self.priority, self.horizon_s)
        if self.node_gpus < 1:
            raise ConfigError(f"goodput: node_gpus must be >= 1, got {self.node_gpus}")

    # ------------------------------------------------------------------ goodput
    def max_gpus(self, app: PolluxApplication, capacity: int, batch: int = 0) -> int:
        """The most GPUs a job may use: each needs at least the smallest per-GPU batch
        (of the largest validated batch, or of the job's own with ``fixed_batch``)."""
        top = batch if self.fixed_batch and batch else app.max_batch
        return max(1, min(capacity, int(top // app.min_local_bsz)))

    def counts_allowed(self, app: PolluxApplication, capacity: int, batch: int = 0
                       ) -> list[int]:
        top = self.max_gpus(app, capacity, batch)
        small = list(range(1, min(self.node_gpus, top) + 1))
        return small + list(range(2 * self.node_gpus, top + 1, self.node_gpus))

    def best(self, app: PolluxApplication, epoch: int, n: int, batch: int = 0
             ) -> tuple[float, BatchConfig]:
        """(goodput, batch config) of the best batch for ``n`` GPUs in ``epoch`` (with
        ``fixed_batch``: of ``batch``, run by the artifact's rule)."""
        fixed = batch if self.fixed_batch else 0
        key = (app.name, epoch, n, fixed)
        hit = self._best.get(key)
        if hit is not None:
            return hit
        counts = packed_counts(n, self.node_gpus)
        if fixed:
            cfg = app.batch_config(n, fixed)
            hit = self._best[key] = (app.gain(cfg.batch, epoch)
                                     / app.config_step_time(counts, cfg), cfg)
            return hit
        lo, hi = app.min_local_bsz, app.max_local_bsz
        atomics = sorted({int(round(lo * (hi / lo) ** (i / 7))) for i in range(8)})
        best = (0.0, BatchConfig(int(hi), 0, n))
        app.prefetch(counts, atomics)
        for atomic in atomics:
            step, sync = app.throughput(counts, atomic)
            for accum in range(self.max_accum + 1):
                b = n * atomic * (accum + 1)
                if b > app.max_batch:
                    break
                if b < app.init_batch:
                    continue
                g = app.gain(b, epoch) / (step + accum * (step - sync))
                if g > best[0]:
                    best = (g, BatchConfig(atomic, accum, n))
        if best[0] == 0.0:
            # the initial batch does not split into n admissible per-GPU batches:
            # train it as the artifact would (its rule of rounding and accumulation)
            cfg = app.batch_config(n, max(app.init_batch, n * int(lo)))
            if cfg.batch <= app.max_batch and cfg.atomic >= lo:
                best = (app.gain(cfg.batch, epoch) / app.config_step_time(counts, cfg), cfg)
        self._best[key] = best
        return best

    # ------------------------------------------------------------------ allocation
    def _weight(self, j: JobView) -> float:
        if self.priority == "srpt":
            return 1.0 / max(j.remaining, 1e-9)
        if self.priority == "las":
            return 1.0 / (j.attained + 3600.0)
        return 1.0

    def _value(self, j: JobView, app: PolluxApplication, n: int, w: float) -> float:
        if n == 0:
            return 0.0
        g = self.best(app, j.epoch, n, j.batch)[0]
        if n != j.gpus:
            # a change restarts the job: over the next T seconds (the horizon, or the
            # job's remaining time if it ends sooner) it makes T / (T + restart) of the
            # progress. With srpt weights the value is then 1 / (remaining time + restart)
            t = self.horizon_s
            if self.uses_remaining and g > 0:
                t = min(t, j.remaining / g)
            g *= t / (t + self.restart_s)
        return w * g

    def allocate(self, jobs: Sequence[JobView], capacity: int, now: float, *,
                 held: Mapping[str, int] | None = None) -> dict[int, Choice]:
        """GPU count and batch of every job (``gpus`` 0: it waits); the counts sum to at
        most ``capacity``."""
        apps = {j.id: self.apps[j.app] for j in jobs}
        weights = {j.id: self._weight(j) for j in jobs}
        allowed = {j.id: self.counts_allowed(apps[j.id], capacity, j.batch) for j in jobs}
        level = greedy(jobs, capacity, allowed,
                       lambda j, n: self._value(j, apps[j.id], n, weights[j.id]))
        return {j.id: Choice(n, self.best(apps[j.id], j.epoch, n, j.batch)[1] if n else None)
                for j in jobs for n in (level[j.id],)}


def greedy(jobs: Sequence[JobView], capacity: int, allowed: Mapping[int, Sequence[int]],
           value: Callable[[JobView, int], float]) -> dict[int, int]:
    """GPUs per job: repeatedly give the job with the best marginal ``value`` per added
    GPU its best next block among its ``allowed`` counts (ascending), until no block adds
    value or the GPUs run out. A heap holds each job's best block; a block that no longer
    fits is recomputed when popped."""
    free = capacity
    level = {j.id: 0 for j in jobs}
    by_id = {j.id: j for j in jobs}
    heap: list[tuple[float, float, int, int]] = []

    def push(jid: int) -> None:
        j = by_id[jid]
        cur = level[jid]
        base = value(j, cur)
        best = None
        for n in allowed[jid]:
            if n <= cur:
                continue
            if n - cur > free:
                break
            score = (value(j, n) - base) / (n - cur)
            if best is None or score > best[0]:
                best = (score, n)
        if best is not None and best[0] > 0:
            heapq.heappush(heap, (-best[0], j.submit, jid, best[1]))

    for j in sorted(jobs, key=lambda j: (j.submit, j.id)):
        push(j.id)
    while heap and free > 0:
        _, _, jid, n = heapq.heappop(heap)
        add = n - level[jid]
        if add > free:
            push(jid)        # stale: fewer GPUs left than this block needs
            continue
        level[jid] = n
        free -= add
        push(jid)
    return level
