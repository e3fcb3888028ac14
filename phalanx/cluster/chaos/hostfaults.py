"""The faults that exist only across test hosts (``phalanx chaos --engine ray``), and the
keeper that brings a host's Ray node back after one.

=============  ==================================================================
kind           what is done
=============  ==================================================================
crash-host     every process of a test host SIGKILLed at once (its raylet, its
               actors, the ranks they started: a machine lost); ``hold`` seconds
               later its node is started again (``ray start --address``)
cut-link       the host's link goes down (a partition: its processes run on and
               nobody hears them), up again ``hold`` seconds later; a node the
               cluster called dead meanwhile is ended and started again
=============  ==================================================================

Only hosts 1.. are hit: host 0 holds the head (the GCS: its loss ends the cluster, the
limit docs/cluster.md states) and the scheduler (its own fault kind). One host fault at a
time, on a host that runs a rank of ours; the next one (and a ``kill -9`` of the
scheduler, whose resume would not see the loss) waits until the host's node is back."""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from phalanx.cluster.chaos import procs
from phalanx.cluster.chaos.faults import Fault, Target, rank_targets
from phalanx.cluster.chaos.jobs import ChaosJob
from phalanx.cluster.chaos.raycluster import RayClusterError, RayTestCluster
from phalanx.cluster.chaos.watch import Seen
from phalanx.cluster.live.engines.ray_cluster import HealthCheck, verdict_s

HOST_KINDS = ("crash-host", "cut-link")
TICK_S = 0.1
SETTLE_S = 25.0       # a cut node the cluster may have called dead leaves within this
GAP_S = 2.0           # after a node is back, before the next host fault
MARGIN_S = 1.0        # around the cluster's verdict on a silent node


@dataclass
class Outage:
    host: int
    fault: Fault
    until: float          # time.monotonic(): the node starts again / the link comes up
    up_at: float = 0.0    # a cut: when its link came up


class HostKeeper(threading.Thread):
    """Carries out the host faults' second half (the link up, the node started again) and
    starts any node whose raylet is gone otherwise (reported: :attr:`problems`)."""

    def __init__(self, cluster: RayTestCluster) -> None:
        super().__init__(name="chaos-host-keeper", daemon=True)
        self.cluster = cluster
        self.check = HealthCheck.from_env(cluster.env())
        self.verdict_s = verdict_s(cluster.env())
        self.outages: list[Outage] = []
        self.problems: list[str] = []
        self.free_at = 0.0
        self._lock = threading.Lock()
        self._halt = threading.Event()

    # ------------------------------------------------------------------ the faults
    def busy(self) -> bool:
        """A host fault is outstanding (or its node just came back)."""
        with self._lock:
            return bool(self.outages) or time.monotonic() < self.free_at

    def detail(self, host: int) -> dict:
        check = self.check
        return {"host": host, "server": self.cluster.topology.servers[host].name,
                "fence_s": check.fence_s(), "silent_s": list(check.silent_s()),
                "verdict_s": self.verdict_s}

    def crash(self, host: int, f: Fault, hold: float) -> None:
        with self._lock:
            f.detail.update(self.detail(host))
            f.detail["killed"] = len(self.cluster.crash_node(host))
            self.outages.append(Outage(host, f, time.monotonic() + hold))

    def cut(self, host: int, f: Fault, hold: float) -> None:
        with self._lock:
            f.detail.update(self.detail(host))
            self.cluster.net.hosts[host].link_down()
            self.outages.append(Outage(host, f, time.monotonic() + hold))

    # ------------------------------------------------------------------ the keeper
    def stop(self) -> list[str]:
        """End every outage now (links up, nodes started), stop; the problems seen."""
        self._halt.set()
        self.join(timeout=300)
        with self._lock:
            for o in self.outages:
                o.until = 0.0
        for _ in range(int(2 * SETTLE_S / TICK_S)):
            if not self.outages:
                break
            self._tick()
            time.sleep(TICK_S)
        self.problems += [f"host {o.host}: its node was not back at the end"
                          for o in self.outages]
        return self.problems

    def run(self) -> None:
        while not self._halt.wait(TICK_S):
            self._tick()

    def _tick(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [o for o in self.outages if now >= o.until]
        for o in due:
            if self._settled(o, now):
                with self._lock:
                    self.outages.remove(o)
                    self.free_at = time.monotonic() + GAP_S
        with self._lock:   # a fault injected meanwhile is an outage before this look
            out = {o.host for o in self.outages}
            gone = [i for i in range(len(self.cluster.net.hosts))
                    if i not in out and self.cluster.raylet(i) is None]
        for i in gone:
            self.problems.append(f"host {i}: its raylet was gone with no fault on it "
                                 f"({time.time():.3f}): started again")
            self._restart(i, None)

    def _settled(self, o: Outage, now: float) -> bool:
        """Take ``o`` one step further; True once its node is back."""
        f, soonest, latest = o.fault, *self.check.silent_s()
        if f.kind == "crash-host":
            return self._restart(o.host, f)
        if not o.up_at:
            self.cluster.net.hosts[o.host].link_up()
            o.up_at = now
            f.detail["up_unix"] = time.time()
        down = o.up_at - (o.until - f.hold)
        if down < soonest - MARGIN_S:
            f.detail["node"] = "kept"      # the cluster cannot have called it dead
            return True
        if down > latest + MARGIN_S or self.cluster.raylet(o.host) is None:
            return self._restart(o.host, f)   # called dead: it leaves, or we end it
        if now - o.up_at > SETTLE_S:
            f.detail["node"] = "kept"
            return True
        return False

    def _restart(self, host: int, f: Fault | None) -> bool:
        try:
            self.cluster.restart_node(host)
        except (RayClusterError, OSError, subprocess.SubprocessError) as e:
            self.problems.append(f"host {host}: its node did not start again: "
                                 f"{str(e).splitlines()[-1][:200]}")
            time.sleep(1.0)
            return False
        if f is not None:
            f.detail["node"] = "started again"
            f.detail["back_unix"] = time.time()
        return True


def host_targets(table: dict[int, procs.Proc], out: Path, jobs: list[ChaosJob],
                 seen: Seen, keeper: HostKeeper) -> list[Target]:
    """Hosts 1.. running a rank of ours (none while a host fault is outstanding): each
    named by the ``job@start`` of every rank it runs."""
    if keeper.busy():
        return []
    ranks = (rank_targets(table, out, jobs, False, seen.rank_index)
             + rank_targets(table, out, jobs, True, seen.rank_index))
    found = []
    for i, host in enumerate(keeper.cluster.net.hosts[1:], start=1):
        ns = host.netns()
        here = sorted({(t.job, seen.driver_start(t.job, t.driver) if t.driver else t.start)
                       for t in ranks if procs.netns(t.pid) == ns})
        if here and keeper.cluster.raylet(i) is not None:
            found.append(Target(",".join(f"{j}@{s}" for j, s in here),
                                f"host {i} ({keeper.cluster.topology.servers[i].name})",
                                0, -1))
    return found


def host_of(target: Target) -> int:
    """The host a :func:`host_targets` target names."""
    return int(target.what.split()[1])
