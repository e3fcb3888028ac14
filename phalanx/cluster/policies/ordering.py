"""Ordering policies: who runs first. Each ``order`` returns a new tuple of job ids (best
first) and never touches the jobs it is given.

``preemptive`` policies are re-evaluated every ``round_s`` seconds (a time slot) and may
stop running jobs; non-preemptive ones only decide who starts next.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from phalanx.catalog import Catalog
from phalanx.cluster.core.jobs import JobState
from phalanx.errors import ConfigError

DEFAULT_SLOT_S = 2400.0   # 40 min: DL jobs run long, so time slots are 40 min to 1 h


class OrderingPolicy(Protocol):
    """Orders the active jobs (first = most deserving); ``preemptive`` orderings run the
    core's preemptive round every ``round_s``."""

    name: str
    preemptive: bool
    round_s: float | None

    def order(self, jobs: Sequence[JobState], now: float) -> tuple[int, ...]: ...

    def stable_until(self, waiting: Sequence[JobState], now: float) -> float:
        """Until when ``order(waiting, t)`` stays what it is at ``now``, as long as no job
        joins the queue (a job leaving does not reorder the rest). Waiting jobs do not
        progress, so their attained service and last start are frozen: the event loop
        reuses one order for the fill passes until then (``math.inf`` = until the queue
        changes) instead of re-sorting the queue at every event."""
        ...


def _check_slot(slot: float) -> None:
    if not 0 < slot < math.inf:
        raise ConfigError(f"time slot must be a finite number > 0 seconds, got {slot}")


@dataclass(frozen=True)
class FIFO:
    """First come, first served (YARN-like); queue order only, no preemption."""

    name: str = "fifo"
    preemptive: bool = False
    round_s: float | None = None

    def stable_until(self, waiting: Sequence[JobState], now: float) -> float:
        return math.inf     # keys of waiting jobs are frozen

    def order(self, jobs: Sequence[JobState], now: float) -> tuple[int, ...]:
        return tuple(j.spec.id for j in sorted(jobs, key=lambda j: (j.spec.submit, j.spec.id)))


@dataclass(frozen=True)
class ShortestJobFirst:
    """Shortest oracle duration first (knows each job's ideal run time); no preemption."""

    name: str = "sjf"
    preemptive: bool = False
    round_s: float | None = None

    def stable_until(self, waiting: Sequence[JobState], now: float) -> float:
        return math.inf     # keys of waiting jobs are frozen

    def order(self, jobs: Sequence[JobState], now: float) -> tuple[int, ...]:
        return tuple(j.spec.id for j in sorted(
            jobs, key=lambda j: (j.spec.duration * j.spec.gpus, j.spec.submit, j.spec.id)))


@dataclass(frozen=True)
class LeastAttainedService:
    """Least attained GPU-time first (continuous LAS), preemptive every slot."""

    name: str = "las"
    preemptive: bool = True
    round_s: float | None = DEFAULT_SLOT_S

    def __post_init__(self) -> None:
        _check_slot(self.round_s or 0)

    def stable_until(self, waiting: Sequence[JobState], now: float) -> float:
        return math.inf     # keys of waiting jobs are frozen

    def order(self, jobs: Sequence[JobState], now: float) -> tuple[int, ...]:
        return tuple(j.spec.id for j in sorted(
            jobs, key=lambda j: (j.attained, j.spec.submit, j.spec.id)))


@dataclass(frozen=True)
class Tiresias:
    """Discretised 2D-LAS (Tiresias, NSDI'19): jobs sit in queues by attained GPU-time
    (``thresholds`` in GPU-seconds split the queues), FIFO inside a queue; a job that has
    waited ``starvation`` times longer than it ever ran (at least one slot) is promoted to
    the top queue so long jobs are not starved (``starvation`` 0: never, as the Pollux
    artifact's). FIFO inside a lower queue is by the time a job entered it when the
    engine records it (``JobState.service_marks``: the interval engine), else by submit."""

    thresholds: tuple[float, ...] = (3600.0, 36000.0)
    starvation: float = 4.0
    name: str = "tiresias"
    preemptive: bool = True
    round_s: float | None = DEFAULT_SLOT_S

    def __post_init__(self) -> None:
        _check_slot(self.round_s or 0)
        if list(self.thresholds) != sorted(self.thresholds) or any(t <= 0 for t in
                                                                   self.thresholds):
            raise ConfigError(f"tiresias thresholds must be positive and increasing, "
                              f"got {self.thresholds}")
        if not 0 <= self.starvation < math.inf:
            raise ConfigError(f"tiresias starvation factor must be >= 0 (0 = off), "
                              f"got {self.starvation}")

    def queue(self, job: JobState, now: float) -> int:
        if not job.running and self.starvation > 0:
            waited = now - job.waiting_since
            if job.executed > 0 and waited >= self.starvation * max(job.executed,
                                                                    self.round_s or 0):
                return 0   # starvation guard
        q = 0
        for t in self.thresholds:
            if job.attained >= t:
                q += 1
        return q

    def promotion_time(self, job: JobState) -> float:
        """When a waiting job that ran before reaches the starvation guard (inf if never)."""
        if job.running or job.executed <= 0 or self.starvation == 0:
            return math.inf
        return job.waiting_since + self.starvation * max(job.executed, self.round_s or 0)

    def stable_until(self, waiting: Sequence[JobState], now: float) -> float:
        # queues by attained service are frozen while waiting; only starvation promotions,
        # at known times, reorder the queue
        return min((t for t in map(self.promotion_time, waiting) if t > now), default=math.inf)

    def entered(self, job: JobState, queue: int) -> float:
        """When the job entered ``queue``: the first recorded boundary at which its
        attained service reached the queue's threshold (submit time for queue 0, or when
        the engine records no marks)."""
        marks = job.service_marks
        if queue == 0 or not marks:
            return job.spec.submit
        i = bisect.bisect_left(marks, self.thresholds[queue - 1], key=lambda m: m[1])
        return marks[i][0] if i < len(marks) else job.spec.submit

    def _key(self, j: JobState, now: float) -> tuple[int, float, float, int]:
        q = self.queue(j, now)
        return (q, self.entered(j, q), j.spec.submit, j.spec.id)

    def order(self, jobs: Sequence[JobState], now: float) -> tuple[int, ...]:
        return tuple(j.spec.id for j in sorted(jobs, key=lambda j: self._key(j, now)))


@dataclass(frozen=True)
class RoundRobin:
    """Time-sliced round robin: every slot the jobs that ran least recently go first (a
    preempted job pays the simulator's checkpoint/restore cost when it resumes)."""

    round_s: float | None = DEFAULT_SLOT_S
    name: str = "rr"
    preemptive: bool = True

    def __post_init__(self) -> None:
        _check_slot(self.round_s or 0)

    def stable_until(self, waiting: Sequence[JobState], now: float) -> float:
        return math.inf     # keys of waiting jobs are frozen

    def order(self, jobs: Sequence[JobState], now: float) -> tuple[int, ...]:
        return tuple(j.spec.id for j in sorted(
            jobs, key=lambda j: (j.last_start, j.spec.submit, j.spec.id)))


def check_thresholds(t: tuple[float, ...]) -> None:
    """``--tiresias-thresholds``: finite GPU-seconds > 0, strictly increasing."""
    if not t or any(not 0 < x < math.inf for x in t) or list(t) != sorted(set(t)):
        raise ConfigError(f"--tiresias-thresholds must be finite GPU-seconds > 0, "
                          f"strictly increasing, got {','.join(map(str, t))}")


def parse_thresholds(text: str) -> tuple[float, ...]:
    """``--tiresias-thresholds`` as typed: a comma list of GPU-seconds."""
    try:
        t = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--tiresias-thresholds {text!r}: not a comma list of numbers"
                          ) from None
    check_thresholds(t)
    return t


def _tiresias(slot_s: float, thresholds: tuple[float, ...] | None,
              starvation: float | None) -> OrderingPolicy:
    d = Tiresias()
    return Tiresias(thresholds=d.thresholds if thresholds is None else thresholds,
                    starvation=d.starvation if starvation is None else starvation,
                    round_s=slot_s)


# every ordering --policy offers: adding one is its class and one line here; an entry makes
# the policy from (the round length, Tiresias's thresholds, its starvation limit)
OrderingFactory = Callable[[float, "tuple[float, ...] | None", "float | None"], OrderingPolicy]
ORDERINGS: Catalog[OrderingFactory] = Catalog("ordering policy", "--policy")
ORDERINGS.add("fifo", lambda slot_s, thresholds, starvation: FIFO(), "first come, first served")
ORDERINGS.add("sjf", lambda slot_s, thresholds, starvation: ShortestJobFirst(),
              "shortest job first (reads each job's length)")
ORDERINGS.add("las", lambda slot_s, thresholds, starvation: LeastAttainedService(
    round_s=slot_s), "least attained service")
ORDERINGS.add("tiresias", _tiresias, "Tiresias: discretised LAS with a starvation limit")
ORDERINGS.add("rr", lambda slot_s, thresholds, starvation: RoundRobin(round_s=slot_s),
              "round robin")


def make_ordering(name: str, slot_s: float = DEFAULT_SLOT_S,
                  thresholds: tuple[float, ...] | None = None,
                  starvation: float | None = None) -> OrderingPolicy:
    """``thresholds`` / ``starvation`` set Tiresias's queues (None: its defaults)."""
    if name not in ORDERINGS:
        raise ConfigError(f"--policy {name}: unknown (choose from {', '.join(ORDERINGS)})")
    return ORDERINGS.get(name)(slot_s, thresholds, starvation)


class ResortEveryEvent:
    """Reference ordering: the wrapped policy, but its queue order expires at once, so the
    fill pass re-sorts the whole waiting queue at every event (the pre-incremental loop).
    The oracle for the cached order (tests) and its baseline (bench/simulator.py)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def stable_until(self, waiting, now: float) -> float:
        return now
