"""What is checked while a chaos schedule runs, every few tenths of a second, in a thread
of the harness: ``scheduler-state.json`` loads (the same checks as ``--resume``), no job
runs twice at once (two starts' ranks alive together, or two drivers), which processes
and drivers the run had (for the leftovers check at the end) and, across test hosts,
which host each of them ran in (for the fence check)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from phalanx.cluster.chaos import procs
from phalanx.cluster.chaos.jobs import ChaosJob
from phalanx.cluster.core.topology import Topology
from phalanx.cluster.live.joblist import LiveJob
from phalanx.cluster.live.state import STATE_FILE, load
from phalanx.errors import PhalanxError

PERIOD_S = 0.25


@dataclass
class Seen:
    """What the watch found; read by the invariants once it stopped."""

    loads: int = 0                                   # state files loaded and checked
    bad_state: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)
    pids: set[int] = field(default_factory=set)      # every process of a job seen
    drivers: set[int] = field(default_factory=set)
    # (unix the state was written, the scheduler's clock in it, the jobs it had running)
    clocks: list[tuple[float, float, tuple[str, ...]]] = field(default_factory=list)
    # each job's drivers in the order they appeared: driver k is the job's start k
    driver_order: dict[str, list[int]] = field(default_factory=dict)
    # a PS driver's ranks, pid -> rank (shards first), from a look that saw them all
    rank_index: dict[int, dict[int, int]] = field(default_factory=dict)
    # test hosts only: (unix, {host: the pids of the run's processes in it}) per look
    on_host: list[tuple[float, dict[int, list[int]]]] = field(default_factory=list)

    def driver_start(self, job: str, pid: int) -> int:
        order = self.driver_order.setdefault(job, [])
        if pid not in order:
            order.append(pid)
        return order.index(pid)

    def clock_at(self, unix: float) -> float | None:
        """The scheduler's clock at ``unix`` (from the last state written before it)."""
        before = [(u, c) for u, c, _ in self.clocks if u <= unix]
        if not before:
            return None
        u, c = before[-1]
        return c + (unix - u)

    def running_at(self, unix: float) -> tuple[str, ...]:
        before = [r for u, _, r in self.clocks if u <= unix]
        return before[-1] if before else ()


class Watch(threading.Thread):
    """The checks above, until :meth:`stop`."""

    def __init__(self, out: Path, jobs: list[ChaosJob], live_jobs: list[LiveJob],
                 topology: Topology, source: str, hosts: dict[str, int] | None = None
                 ) -> None:
        super().__init__(name="chaos-watch", daemon=True)
        self.out, self.jobs, self.live_jobs = out, jobs, live_jobs
        self.topology, self.source = topology, source
        self.hosts = hosts or {}     # a test host's network namespace -> its index
        self.seen = Seen()
        self._halt = threading.Event()
        self._last = None

    def stop(self) -> Seen:
        self._halt.set()
        self.join(timeout=10)
        self.look()    # once more, at the end
        return self.seen

    def run(self) -> None:
        while not self._halt.wait(PERIOD_S):
            self.look()

    def look(self) -> None:
        self._state()
        self._processes()

    def _state(self) -> None:
        path = self.out / STATE_FILE
        try:
            text = path.read_text()
        except FileNotFoundError:
            return
        except OSError as e:
            self.seen.bad_state.append(f"{time.time():.3f}: cannot read {path.name}: {e}")
            return
        if text == self._last:
            return
        self._last = text
        try:
            load(self.out, self.live_jobs, self.topology, self.source)
            d = json.loads(text)
        except (PhalanxError, ValueError) as e:
            self.seen.bad_state.append(f"{time.time():.3f}: {e}")
            return
        self.seen.loads += 1
        running = tuple(sorted(n for n, j in d["jobs"].items() if j["status"] == "running"))
        if "unix" in d:
            self.seen.clocks.append((float(d["unix"]), float(d["clock"]), running))

    def _processes(self) -> None:
        table = procs.scan()
        now = time.time()
        mine: set[int] = set()
        for j in self.jobs:
            starts = {}
            for s, r, pid in procs.rank_pids(self.out / "ranks" / f"{j.name}.jsonl"):
                if procs.live(table, pid):
                    starts.setdefault(s, []).append(r)
                    mine.add(pid)
            drivers = procs.drivers(table, self.out / "jobs" / j.name)
            for d in drivers:
                self.seen.drivers.add(d.pid)
                self.seen.driver_start(j.name, d.pid)
                ranks = procs.driver_ranks(table, d.pid)
                mine.update(p.pid for p in ranks)
                world = j.kind.servers + j.kind.gpus
                if j.kind.ps and d.pid not in self.seen.rank_index and len(ranks) == world:
                    self.seen.rank_index[d.pid] = {p.pid: i for i, p in enumerate(ranks)}
                mine.add(d.pid)
            if len(starts) > 1:
                self.seen.twice.append(f"{now:.3f}: {j.name}: ranks of starts "
                                       f"{sorted(starts)} alive at once ({starts})")
            if len(drivers) > 1:
                self.seen.twice.append(f"{now:.3f}: {j.name}: {len(drivers)} drivers alive "
                                       f"at once (pids {[d.pid for d in drivers]})")
        self.seen.pids |= mine
        if self.hosts:
            where: dict[int, list[int]] = {}
            for pid in sorted(mine):
                host = self.hosts.get(procs.netns(pid))
                if host is not None:
                    where.setdefault(host, []).append(pid)
            self.seen.on_host.append((now, where))
