"""Trace-driven simulator: a heap of events (arrivals, completions, scheduling rounds) over
one ``ClusterState``. Policies decide; this loop only keeps time and applies decisions.

Scheduling happens at two moments:
* after every batch of simultaneous events, a *fill* pass starts waiting jobs (in the
  ordering policy's order) on free devices — nothing running is stopped;
* every ``round_s`` seconds of a preemptive ordering policy, a *round*: the policy orders
  all active jobs, the first ones that fit in the cluster's capacity keep/get devices, the
  running rest are preempted (a resumed job makes no progress for ``checkpoint_cost_s``).

A job's progress rate comes from the perf model and changes when a neighbour starts or
stops on one of its servers (PCIe interference); its completion event is then re-pushed
and the old one is ignored (a version number).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from phalanx.cluster.core.allocator import Placement
from phalanx.cluster.core.jobs import JobSpec, JobState
from phalanx.cluster.core.result import SimResult
from phalanx.cluster.core.scheduler import SchedulerCore
from phalanx.cluster.core.topology import Topology
from phalanx.cluster.model.interference import kind_of
from phalanx.cluster.model.perf import PerfModel, Shape
from phalanx.cluster.policies import AdmissionPolicy, OrderingPolicy, PlacementPolicy
from phalanx.errors import ConfigError
from phalanx.metrics import Progress

_COMPLETE, _ARRIVE, _ROUND = 0, 1, 2   # same time: free devices first, then arrivals, rounds


@dataclass(frozen=True)
class SimConfig:
    """The event engine's settings: a resumed job's checkpoint cost, progress, invariant
    checks."""

    checkpoint_cost_s: float = 60.0   # a preempted job's restore time when it resumes
    progress: bool = False
    check_invariants: bool = False    # verify the bitmaps after every event (tests)

    def __post_init__(self) -> None:
        if not (0 <= self.checkpoint_cost_s < math.inf):
            raise ConfigError(f"--checkpoint-cost must be >= 0, got {self.checkpoint_cost_s}")


def allocation_shape(topology: Topology, perf: PerfModel, spec: JobSpec, p: Placement
                     ) -> tuple[Shape, list]:
    """The perf model's view of a placement, and (server, own devices, switches,
    their capacity) per server used."""
    t = topology
    per_server: dict[int, list[int]] = {}
    for d in p.devices:
        per_server.setdefault(t.device_server[d], []).append(d)
    cores = dict(p.cores)
    servers, extra, racks, zones = [], 0, set(), set()
    speed, share = math.inf, 1.0
    prof = perf.profile(spec.model)
    for s in sorted(per_server):
        devs = per_server[s]
        sws = tuple(sorted({t.device_switch[d] for d in devs}))
        extra += len(sws) - 1
        servers.append((s, len(devs), sws, sum(t.switch_size[w] for w in sws)))
        racks.add(t.server_rack[s])
        zones.add(t.rack_zone[t.server_rack[s]])
        dtype = t.servers[s].device_type
        speed = min(speed, prof.speed_on(dtype, t.device_types[dtype].speed))
        share = min(share, cores[s] / (spec.cpu_per_gpu * len(devs)))
    shape = Shape(tuple(n for _, n, _, _ in servers), extra, len(racks), len(zones),
                  speed, share)
    return shape, servers


class _Running:
    """Per running job: its allocation split by server, for the interference update."""

    __slots__ = ("iso_rate", "servers", "kind")

    def __init__(self, servers: list[tuple[int, int, tuple[int, ...], int]],
                 iso_rate: float, kind: str = "") -> None:
        self.servers = servers      # (server, own devices, switches used, their capacity)
        self.iso_rate = iso_rate
        self.kind = kind            # its interference class (pairwise interference)


class Simulator:
    """The event engine: owns the clock (a heap of arrivals, completions and rounds), each
    running job's rate under the perf model (re-rated when a neighbour starts or stops)
    and its completion. Queue, admission, the fill pass and the preemptive round are the
    ``SchedulerCore``'s."""

    def __init__(self, topology: Topology, jobs: Sequence[JobSpec], ordering: OrderingPolicy,
                 placement: PlacementPolicy, perf: PerfModel,
                 admission: AdmissionPolicy | None = None, config: SimConfig | None = None
                 ) -> None:
        self.topology, self.specs = topology, list(jobs)
        self.ordering, self.placement = ordering, placement
        self.perf, self.config = perf, config if config is not None else SimConfig()
        # queue, admission and the fill pass are shared with the live executor
        self.core = SchedulerCore(topology, ordering, placement, admission)
        self.cluster = self.core.cluster
        self.waiting = self.core.waiting
        self.now = 0.0
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self.states: dict[int, JobState] = self.core.states
        self.running: dict[int, JobState] = {}
        self._run_info: dict[int, _Running] = {}
        self._server_jobs: list[dict[int, None]] = [{} for _ in topology.servers]
        self._interference = perf.options.interference
        self._k_sw, self._k_srv = perf.options.k_switch, perf.options.k_server

    # ------------------------------------------------------------------ heap
    def _push(self, t: float, kind: int, job: int, version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, job, version))

    # ------------------------------------------------------------------ progress
    def _advance(self, st: JobState) -> None:
        now, before = self.now, st.last_update
        if self.core.catch_up(st, now):
            start = max(before, st.progress_from)
            if now > start:
                st.remaining -= st.rate * (now - start)

    def _crowding(self, info: _Running) -> float:
        if self.perf.co is not None:
            return self._pair_load(info)
        c = self.cluster
        t = self.topology
        worst = 0.0
        for s, own, switches, sw_cap in info.servers:
            busy_sw = sum(t.switch_size[w] - c.switch_free[w] for w in switches) - own
            busy_rest = (t.server_size[s] - c.server_free[s]) - own - busy_sw
            x = self._k_sw * busy_sw / sw_cap + self._k_srv * busy_rest / t.server_size[s]
            worst = max(worst, x)
        return worst

    def _pair_load(self, info: _Running) -> float:
        """The worst server's load from each neighbour's measured pair (CoLocation), plus
        the link level's for a job across servers."""
        t, co = self.topology, self.perf.co
        worst = 0.0
        for s, _, switches, sw_cap in info.servers:
            mine = set(switches)
            neighbours = []
            for jid in self._server_jobs[s]:
                other = self._run_info.get(jid)
                if other is None or other is info:
                    continue
                devs = [d for d in self.cluster.allocations[jid].devices
                        if t.device_server[d] == s]
                on = sum(1 for d in devs if t.device_switch[d] in mine)
                neighbours.append((other.kind, on, len(devs) - on))
            worst = max(worst, co.load(info.kind, neighbours, sw_cap, t.server_size[s]))
        if len(info.servers) > 1 and "link" in co.levels:
            # the link level: every other job across servers on one of mine shares their
            # links (model/colocated.py reads the same for the interval engine)
            across = {jid for s, _, _, _ in info.servers for jid in self._server_jobs[s]
                      if (o := self._run_info.get(jid)) is not None and o is not info
                      and len(o.servers) > 1}
            worst += co.link_load(info.kind, [self._run_info[j].kind for j in sorted(across)])
        return worst

    def _reschedule(self, st: JobState) -> None:
        """New rate from the current neighbours; re-push the completion event."""
        info = self._run_info[st.spec.id]
        rate = info.iso_rate
        if self._interference:
            rate *= self.perf.interference_factor(st.spec, self._crowding(info))
        cores = self.perf.options.shared_cores
        if cores and self.cluster.busy > cores:
            rate *= cores / self.cluster.busy     # slots on one machine's shared cores
        st.rate = rate
        st.version += 1
        begin = max(self.now, st.progress_from)
        self._push(begin + max(st.remaining, 0.0) / rate, _COMPLETE, st.spec.id, st.version)

    def _touch_neighbours(self, servers: list[int], skip: int) -> None:
        if self.perf.options.shared_cores:
            servers = list(range(len(self.topology.servers)))   # every job shares the cores
        elif not self._interference:
            return
        seen = set()
        for s in servers:
            for jid in self._server_jobs[s]:
                if jid != skip and jid not in seen:
                    seen.add(jid)
                    st = self.running[jid]
                    self._advance(st)
                    self._reschedule(st)

    # ------------------------------------------------------------------ start / stop
    def _shape(self, spec: JobSpec, p: Placement) -> tuple[Shape, list]:
        return allocation_shape(self.topology, self.perf, spec, p)

    def _start(self, st: JobState, p: Placement) -> None:
        jid = st.spec.id
        self.core.allocate(st, p)
        shape, servers = self._shape(st.spec, p)
        self._run_info[jid] = _Running(servers, self.perf.isolated_rate(st.spec, shape,
                                                                        self.topology),
                                       kind_of(st.spec.model, st.spec.kind))
        self.running[jid] = st
        self.core.started(st, p.devices, self.now)
        resumed = st.preemptions > 0
        st.progress_from = self.now + (self.config.checkpoint_cost_s if resumed else 0.0)
        st.last_update = self.now
        server_ids = [s for s, _, _, _ in servers]
        for s in server_ids:
            self._server_jobs[s][jid] = None
        self._reschedule(st)
        self._touch_neighbours(server_ids, jid)

    def _stop(self, st: JobState) -> None:
        jid = st.spec.id
        self._advance(st)
        self.core.stopped(st, self.now)
        info = self._run_info.pop(jid)
        del self.running[jid]
        st.version += 1
        server_ids = [s for s, _, _, _ in info.servers]
        for s in server_ids:
            del self._server_jobs[s][jid]
        self._touch_neighbours(server_ids, jid)

    def _finish(self, st: JobState) -> None:
        self._stop(st)
        self.core.ended(st, self.now)

    def _preempt(self, st: JobState) -> None:
        self._stop(st)
        self.core.preempted(st, self.now)

    # ------------------------------------------------------------------ scheduling
    def _fill(self) -> None:
        self.core.fill(self.now, self._start)

    def _round(self) -> None:
        for st in self.running.values():
            self._advance(st)      # attained service must be current for LAS / Tiresias
        d = self.core.preemptive_round(self.running.values(), self.now)
        if d is not None:     # stopped at once: the kept ones start on what they freed
            for jid in d.stop:
                self._preempt(self.running[jid])
            self.core.try_start(d.start, self._start)

    # ------------------------------------------------------------------ loop
    def run(self) -> SimResult:
        t0 = time.perf_counter()
        c = self.cluster
        self.result = res = self.core.result
        for spec in self.specs:
            self._push(spec.submit, _ARRIVE, spec.id)
        pending_arrivals = len(self.specs)
        round_s = self.ordering.round_s if self.ordering.preemptive else None
        if round_s and self.specs:
            self._push(min(s.submit for s in self.specs) + round_s, _ROUND, -1)
        by_id = {s.id: s for s in self.specs}
        progress = Progress(len(self.specs), "simulate", enabled=self.config.progress)
        done = 0
        heap = self._heap
        while heap:
            self.now = now = heap[0][0]
            do_round = False
            while heap and heap[0][0] == now:
                _, kind, _, jid, version = heapq.heappop(heap)
                res.events += 1
                if kind == _COMPLETE:
                    st = self.running.get(jid)
                    if st is None or st.version != version:
                        continue   # stale: the job was preempted or re-rated since
                    self._finish(st)
                    done += 1
                elif kind == _ARRIVE:
                    pending_arrivals -= 1
                    self.core.submit(by_id[jid], now)
                else:
                    do_round = True
            if do_round:
                self._round()
            self._fill()
            if do_round and (self.running or pending_arrivals):
                # no round once nothing runs and nothing will arrive: a job still waiting
                # then cannot start on the empty cluster, and rounds would never end
                self._push(now + round_s, _ROUND, -1)
            if self.config.check_invariants:
                c.check_invariants()
            self.core.sample(now)
            if done % 512 == 0:
                progress.update(done + len(res.rejected), clock_h=now / 3600)
        progress.update(len(self.specs))
        progress.close()
        return self.core.finish(self.specs, time.perf_counter() - t0)
