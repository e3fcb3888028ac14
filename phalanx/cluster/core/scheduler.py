"""The scheduling half shared by every engine (blox-style: one loop, several clocks): the
simulated event and interval engines and the live cluster (local, Ray, Slurm) all run
their decisions through one ``SchedulerCore``.

It owns admission and the waiting queue, the fill pass (start waiting jobs in the ordering
policy's order on what the placement policy finds in the ``ClusterState``), the two rounds
(:meth:`SchedulerCore.preemptive_round` and :meth:`SchedulerCore.elastic_round`, each
written once, here), arrivals, attained service, and the series a run reports. An engine
owns its clock and how a decision is applied: it starts, stops and resizes jobs through
callbacks; the simulators compute rates and completion times, the live engines launch and
signal processes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from phalanx.cluster.core.allocator import ClusterState, Placement
from phalanx.cluster.core.jobs import JobSpec, JobState
from phalanx.cluster.core.result import SimResult
from phalanx.cluster.core.topology import Topology
from phalanx.cluster.core.view import Choice, ElasticPolicy, JobView

if TYPE_CHECKING:
    from phalanx.cluster.policies import AdmissionPolicy, OrderingPolicy, PlacementPolicy

StartFn = Callable[[JobState, Placement], None]
StopFn = Callable[[JobState], None]


class ElasticEngine(Protocol):
    """How an engine applies the elastic round's answer, job by job (in the order of the
    views), then ``place`` once for every job that moved."""

    def keep(self, st: JobState, choice: Choice) -> None:
        """Same allocation as now (a waiting job: still none); a new batch may come."""

    def vacate(self, st: JobState) -> None:
        """The job holds GPUs and gets none."""

    def move(self, st: JobState, choice: Choice) -> None:
        """The job gets another (non-zero) allocation: release what it holds."""

    def place(self, moves: Sequence[tuple[Choice, JobState]]) -> None:
        """Every moved job, after all were released."""


def keep_in_order(order: Sequence[int], gpus: Callable[[int], int], capacity: int) -> set[int]:
    """The jobs a preemptive round keeps: greedily in priority order, each that still fits
    the cluster's GPUs (a job too large for what is left is passed over; smaller ones after
    it may still fit)."""
    budget, keep = capacity, set()
    for jid in order:
        g = gpus(jid)
        if g <= budget:
            keep.add(jid)
            budget -= g
    return keep


def usable_gpus(topology: Topology) -> int:
    """The largest gang the cluster can ever run: each GPU needs one CPU core."""
    return sum(min(s.num_devices, s.cpu_cores) for s in topology.servers)


def oversize_reason(gpus: int, capacity: int, usable: int) -> str:
    """Why a gang of ``gpus`` can never run on this cluster ('' if it can): more GPUs than
    the cluster has, or than it can give a CPU core each."""
    if gpus > capacity:
        return f"needs {gpus} GPUs, cluster has {capacity}"
    if gpus > usable:
        return (f"needs {gpus} GPUs, cluster has {capacity} but only {usable} with a free "
                f"CPU core each")
    return ""


@dataclass(frozen=True)
class Arrival:
    """What happened to a submitted job: ``state`` is set when it joined the queue."""

    state: JobState | None
    reason: str = ""          # why it was rejected
    oversize: bool = False    # rejected because it can never fit this cluster


class SchedulerCore:
    """The scheduler every engine shares: admission, the waiting queue, the fill pass, the
    preemptive and the elastic round, every job's state (``states``), attained service and
    the run's series (``result``). It decides; the engine that owns it applies."""

    def __init__(self, topology: Topology, ordering: OrderingPolicy,
                 placement: PlacementPolicy, admission: AdmissionPolicy | None = None,
                 elastic: ElasticPolicy | None = None) -> None:
        self.topology = topology
        self.ordering, self.placement = ordering, placement
        self.admission = admission       # None: accept every job that fits
        self.elastic = elastic
        self.cluster = ClusterState(topology)
        self.waiting: dict[int, JobState] = {}
        self.states: dict[int, JobState] = {}    # every admitted job
        self.result = SimResult([], [], capacity=self.cluster.capacity)
        self.fragmentation_blocked = 0       # placements refused although GPUs were free
        self._gangs: dict[int, int] = {}     # waiting jobs per gang size
        self._outstanding: dict[str, int] = {}
        self._order: tuple[int, ...] = ()
        self._order_stale = True
        self._order_until = math.inf
        self._last_sample = (-1, -1)
        # every device of a gang needs at least one CPU core of its server
        self.usable = usable_gpus(topology)

    # ------------------------------------------------------------------ queue
    def arrive(self, spec: JobSpec, now: float) -> Arrival:
        reason = oversize_reason(spec.gpus, self.cluster.capacity, self.usable)
        if reason:
            return Arrival(None, reason, oversize=True)
        if self.admission is not None:
            decision = self.admission.admit(spec, self.cluster, self._outstanding)
            if not decision.accept:
                return Arrival(None, decision.reason)
        st = JobState(spec, remaining=spec.work, waiting_since=now, last_update=now)
        self.enqueue(st)
        self._outstanding[spec.vc] = self._outstanding.get(spec.vc, 0) + spec.gpus
        return Arrival(st)

    def submit(self, spec: JobSpec, now: float) -> JobState | None:
        """A job arrives: its state once admitted, else None (the rejection and its reason
        are in ``result``)."""
        arrival = self.arrive(spec, now)
        if arrival.state is None:
            self.result.rejected.append((spec, arrival.reason))
            self.result.oversize += arrival.oversize
            return None
        self.states[spec.id] = arrival.state
        return arrival.state

    def enqueue(self, st: JobState) -> None:
        self.waiting[st.spec.id] = st
        self._gangs[st.spec.gpus] = self._gangs.get(st.spec.gpus, 0) + 1
        self.cluster.queued_gpus += st.spec.gpus
        self._order_stale = True

    def preempted(self, st: JobState, now: float) -> None:
        """A job a round stopped (its devices released) waits in the queue again."""
        st.preemptions += 1
        st.waiting_since = now
        self.enqueue(st)

    def _dequeue(self, st: JobState) -> None:
        del self.waiting[st.spec.id]
        g = st.spec.gpus
        self._gangs[g] -= 1
        self.cluster.queued_gpus -= g
        if not self._gangs[g]:
            del self._gangs[g]

    def regang(self, st: JobState, gpus: int) -> None:
        """A waiting job's gang size changes (an elastic policy resized it)."""
        self._dequeue(st)
        st.spec = dataclasses.replace(st.spec, gpus=gpus)
        self.enqueue(st)

    def abandon(self, st: JobState) -> None:
        """A waiting job leaves the queue for good without running again (it fails)."""
        self._dequeue(st)
        self.done(st.spec)

    def done(self, spec: JobSpec) -> None:
        """A job left for good (finished or failed): its VC quota is free again."""
        self._outstanding[spec.vc] -= spec.gpus

    # ------------------------------------------------------------------ devices
    def allocate(self, st: JobState, placement: Placement) -> None:
        self.cluster.allocate(st.spec.id, placement)
        self._dequeue(st)

    def release(self, st: JobState) -> None:
        self.cluster.release(st.spec.id)

    # ------------------------------------------------------------------ fill pass
    def try_start(self, ids: Sequence[int], start: StartFn) -> None:
        """Start the jobs of ``ids`` (in that order) that fit now; skip those that do not
        (backfilling). ``start`` must call ``allocate``."""
        c = self.cluster
        failed = c.capacity + 1     # smallest gang that found no room in this pass
        for jid in ids:
            if not self._gangs or c.total_free < min(self._gangs):
                return     # nothing waiting fits any more
            st = self.waiting.get(jid)
            if st is None:
                continue
            g = st.spec.gpus
            if g > c.total_free or g >= failed:
                continue   # a bigger gang cannot fit where a smaller one did not
            p = self.placement.place(st.spec, c)
            if p is None:
                failed = g
                self.fragmentation_blocked += 1
                continue
            start(st, p)

    def fill(self, now: float, start: StartFn) -> None:
        c = self.cluster
        if not self.waiting or c.total_free < min(self._gangs):
            return
        if self._order_stale or now >= self._order_until:
            # re-sort only when a job joined the queue or the policy said the order expires
            # (started jobs stay in the cached order and are skipped)
            waiting = tuple(self.waiting.values())
            self._order = self.ordering.order(waiting, now)
            self._order_until = self.ordering.stable_until(waiting, now)
            self._order_stale = False
        self.try_start(self._order, start)

    # ------------------------------------------------------------------ the rounds
    def preemptive_round(self, running: Sequence[JobState], now: float, stop: StopFn,
                         start: StartFn | None) -> set[int] | None:
        """The round of a time-sliced ordering: order every active job, keep the first
        that fit the cluster's GPUs (running jobs that cannot be preempted first), ``stop``
        the running rest, ``start`` the kept waiting ones in order where they fit now
        (None: the engine starts them in its own fill pass). The kept jobs' ids; None when
        nothing is active."""
        running = list(running)
        active = tuple(running) + tuple(self.waiting.values())
        if not active:
            return None
        order = self.ordering.order(active, now)
        pinned = {st.spec.id for st in running if st.spec.not_preemptible}
        if pinned:
            order = [j for j in order if j in pinned] + [j for j in order if j not in pinned]
        gpus = {st.spec.id: st.spec.gpus for st in active}
        keep = keep_in_order(order, gpus.__getitem__, self.cluster.capacity)
        for st in [s for s in running if s.spec.id not in keep]:
            stop(st)
        if start is not None:
            self.try_start([j for j in order if j in keep], start)
        return keep

    def elastic_round(self, views: Sequence[JobView], capacity: int, now: float,
                      engine: ElasticEngine) -> None:
        """The round of an elastic policy: ask it what each job gets now (GPUs, batch,
        servers), then hand the engine the difference: jobs whose allocation is unchanged,
        jobs that lose their GPUs, jobs that move; the moved ones are placed last, so
        that growing jobs find the GPUs the shrinking ones left."""
        if not views:
            return
        assert self.elastic is not None
        choice = self.elastic.allocate(tuple(views), capacity, now)
        moves = []
        for v in views:
            c = choice[v.id]
            if v.limit and c.gpus > v.limit:
                c = dataclasses.replace(c, gpus=v.limit)
            st = self.states[v.id]
            same = c.servers == v.placement if c.servers else c.gpus == v.gpus
            if c.device_type and c.gpus and c.device_type != v.device_type:
                same = False      # another GPU type: a move, even at the same count
            if same:
                engine.keep(st, c)
            elif c.gpus == 0:
                engine.vacate(st)
            else:
                engine.move(st, c)
                moves.append((c, st))
        engine.place(moves)

    # ------------------------------------------------------------------ bookkeeping
    @staticmethod
    def serve(st: JobState, seconds: float, gpus: int) -> None:
        """``st`` ran ``seconds`` on ``gpus`` GPUs (what LAS and Tiresias order by)."""
        st.executed += seconds
        st.attained += seconds * gpus

    def catch_up(self, st: JobState, now: float) -> bool:
        """Attained service of a running job up to ``now``; False if none was due."""
        dt = now - st.last_update
        if dt <= 0:
            return False
        self.serve(st, dt, st.spec.gpus)
        st.last_update = now
        return True

    def sample(self, now: float, every: bool = False) -> None:
        """One point of the series (busy GPUs, queue, fragmentation): when either changed,
        or at ``every`` call (the interval engine's boundaries)."""
        c, res = self.cluster, self.result
        key = (c.busy, len(self.waiting))
        if every or key != self._last_sample:
            self._last_sample = key
            res.times.append(now)
            res.busy.append(c.busy)
            res.queue.append(len(self.waiting))
            res.frag.append(c.fragmentation)

    def finish(self, specs: Sequence[JobSpec], wall_s: float) -> SimResult:
        """The run's result: every admitted job's state in ``specs`` order."""
        res = self.result
        res.jobs = [self.states[s.id] for s in specs if s.id in self.states]
        res.fragmentation_blocked = self.fragmentation_blocked
        res.wall_s = wall_s
        return res
