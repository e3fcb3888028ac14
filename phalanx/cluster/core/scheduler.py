"""The scheduling half shared by every engine (blox-style: one loop, several clocks): the
simulated event and interval engines and the live cluster (local, Ray, Slurm) all run
their decisions through one ``SchedulerCore``.

It owns admission and the waiting queue, the fill pass (start waiting jobs in the ordering
policy's order on what the placement policy finds in the ``ClusterState``), the two rounds
(:meth:`SchedulerCore.preemptive_round` and :meth:`SchedulerCore.elastic_round`, each
written once, here, each returning a :class:`Decision`), arrivals, attained service, and
the series a run reports. An engine owns its clock and applies a decision: it starts, stops
and resizes jobs (the simulators compute rates and completion times, the live engines
launch and signal processes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from phalanx.cluster.core.allocator import ClusterState, Placement
from phalanx.cluster.core.jobs import JobSpec, JobState
from phalanx.cluster.core.result import SimResult
from phalanx.cluster.core.topology import Topology
from phalanx.cluster.core.view import Choice, ElasticPolicy, JobView

if TYPE_CHECKING:
    from phalanx.cluster.policies import AdmissionPolicy, OrderingPolicy, PlacementPolicy

StartFn = Callable[[JobState, Placement], None]


@dataclass(frozen=True)
class Change:
    """One job's part of an elastic round: ``keep`` (the allocation it holds, or still
    none; a new batch may come), ``vacate`` (it holds GPUs and gets none), ``move``
    (another, non-zero allocation: what it holds is released, then it is placed)."""

    kind: str
    job: int
    choice: Choice


@dataclass(frozen=True)
class Decision:
    """A round as a value (Ray Train's ``ResizeDecision``, Blox's ``(to_suspend,
    to_launch)``): the engine that owns the core only applies it.

    Preemptive round: ``stop`` the running jobs it did not keep (in order), then start
    the kept waiting ones in ``start`` order where they fit (the core's fill pass finds
    their placements once the engine has freed the stopped ones' devices: at once in
    simulation, when their ranks are gone live); ``kept``: every job kept.
    Elastic round: ``changes``, every job's in the views' order (the order jobs re-enter
    the queue in), and ``place``, the moved ones in :func:`placement_order`."""

    stop: tuple[int, ...] = ()
    start: tuple[int, ...] = ()
    kept: frozenset[int] = frozenset()
    changes: tuple[Change, ...] = ()
    place: tuple[Change, ...] = ()


def placement_order(moves: Sequence[tuple[int, JobState]]) -> list[JobState]:
    """The order jobs given a new allocation are placed in, by simulation and live alike:
    biggest first (``moves``: each job's new GPU count and state), so that a growing job
    finds the GPUs shrinking ones left before small ones fragment them; ties by submission
    then id."""
    return [st for _, st in sorted(moves, key=lambda m: (-m[0], m[1].spec.submit,
                                                         m[1].spec.id))]


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
        self.cluster.holders[st.spec.id] = st.spec
        self._dequeue(st)

    def release(self, st: JobState) -> None:
        self.cluster.release(st.spec.id)

    # ------------------------------------------------------------------ a job's record
    # (every engine keeps it through these, once: started, stopped, back in the queue,
    # ended finished or failed)
    @staticmethod
    def started(st: JobState, devices: tuple[int, ...], now: float) -> None:
        """``st`` runs on ``devices`` from ``now`` (its first start, a resume or a
        restart; the engine allocated them)."""
        if st.start < 0:
            st.start = now
        st.running = True
        st.last_start = now
        st.placements.append((now, devices))

    def stopped(self, st: JobState, now: float) -> None:
        """``st`` no longer runs from ``now``: its devices are free (the placement it
        started last ends there: ``st.stops``)."""
        self.release(st)
        st.running = False
        st.stops.append(now)

    def requeue(self, st: JobState, now: float) -> None:
        """``st`` waits again, not preempted by a round (it lost a server, it failed and
        starts again, it moves to another allocation)."""
        st.waiting_since = now
        self.enqueue(st)

    def ended(self, st: JobState, at: float, failure: str = "") -> None:
        """``st`` left for good at ``at``: finished, or failed with ``failure``."""
        st.end = at
        st.remaining = 0.0
        if failure:
            st.failure = failure
        self.done(st.spec)

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
    def preemptive_round(self, running: Sequence[JobState], now: float) -> Decision | None:
        """The round of a time-sliced ordering: order every active job, keep the first
        that fit the cluster's GPUs (running jobs that cannot be preempted first); the
        running rest are to stop, the kept ones to start in order where they fit. None
        when nothing is active."""
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
        return Decision(stop=tuple(s.spec.id for s in running if s.spec.id not in keep),
                        start=tuple(j for j in order if j in keep), kept=frozenset(keep))

    def elastic_round(self, views: Sequence[JobView], capacity: int, now: float,
                      held: Mapping[str, int] | None = None) -> Decision:
        """The round of an elastic policy: ask it what each job gets now (GPUs, batch,
        servers; ``held``: GPUs per type others hold), then the difference from what each
        holds: jobs whose allocation is unchanged, jobs that lose their GPUs, jobs that
        move; the moved ones are placed last (:func:`placement_order`), so that growing
        jobs find the GPUs the shrinking ones left."""
        if not views:
            return Decision()
        assert self.elastic is not None
        choice = self.elastic.allocate(tuple(views), capacity, now, held=held)
        changes, moves = [], []
        for v in views:
            c = choice[v.id]
            if v.limit and c.gpus > v.limit:
                c = dataclasses.replace(c, gpus=v.limit)
            same = c.servers == v.placement if c.servers else c.gpus == v.gpus
            if c.device_type and c.gpus and c.device_type != v.device_type:
                same = False      # another GPU type: a move, even at the same count
            kind = "keep" if same else "vacate" if c.gpus == 0 else "move"
            changes.append(Change(kind, v.id, c))
            if kind == "move":
                moves.append((c.gpus, self.states[v.id]))
        by_id = {ch.job: ch for ch in changes}
        return Decision(changes=tuple(changes),
                        place=tuple(by_id[st.spec.id] for st in placement_order(moves)))

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
