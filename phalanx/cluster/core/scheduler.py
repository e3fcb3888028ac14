"""The scheduling half shared by the simulated and the live cluster (blox-style: one loop,
two clocks): admission, the waiting queue and the fill pass that starts waiting jobs in the
ordering policy's order on whatever the placement policy finds in the ``ClusterState``.

The caller owns time and execution: it calls ``arrive`` when a job is submitted, ``fill``
after every batch of events with a ``start`` callback (the simulator computes a rate and
pushes a completion event; the live executor launches a process), and ``release`` when a
job stops. Neither caller re-implements queueing or placement.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from phalanx.cluster.core.allocator import ClusterState, Placement
from phalanx.cluster.core.jobs import JobSpec, JobState
from phalanx.cluster.core.topology import Topology
from phalanx.cluster.policies import AcceptAll, AdmissionPolicy, OrderingPolicy, PlacementPolicy

StartFn = Callable[[JobState, Placement], None]


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
    def __init__(self, topology: Topology, ordering: OrderingPolicy,
                 placement: PlacementPolicy, admission: AdmissionPolicy | None = None) -> None:
        self.topology = topology
        self.ordering, self.placement = ordering, placement
        self.admission = admission if admission is not None else AcceptAll()
        self.cluster = ClusterState(topology)
        self.waiting: dict[int, JobState] = {}
        self.fragmentation_blocked = 0       # placements refused although GPUs were free
        self._gangs: dict[int, int] = {}     # waiting jobs per gang size
        self._outstanding: dict[str, int] = {}
        self._order: tuple[int, ...] = ()
        self._order_stale = True
        self._order_until = math.inf
        # every device of a gang needs at least one CPU core of its server
        self.usable = sum(min(s.num_devices, s.cpu_cores) for s in topology.servers)

    # ------------------------------------------------------------------ queue
    def arrive(self, spec: JobSpec, now: float) -> Arrival:
        reason = oversize_reason(spec.gpus, self.cluster.capacity, self.usable)
        if reason:
            return Arrival(None, reason, oversize=True)
        decision = self.admission.admit(spec, self.cluster, self._outstanding)
        if not decision.accept:
            return Arrival(None, decision.reason)
        st = JobState(spec, remaining=spec.work, waiting_since=now, last_update=now)
        self.enqueue(st)
        self._outstanding[spec.vc] = self._outstanding.get(spec.vc, 0) + spec.gpus
        return Arrival(st)

    def enqueue(self, st: JobState) -> None:
        self.waiting[st.spec.id] = st
        self._gangs[st.spec.gpus] = self._gangs.get(st.spec.gpus, 0) + 1
        self.cluster.queued_gpus += st.spec.gpus
        self._order_stale = True

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
