"""A real Ray cluster on test hosts, started the way a user starts one (docs/cluster.md):
three test hosts (network namespaces on one bridge, :class:`phalanx.runtime.hosts.TestNetwork`),
``ray start --head`` in host 0 and ``ray start --address`` in hosts 1 and 2 as separate
processes, each node declaring its server's devices (the ``three-nodes`` topology: one
each, ``--resources '{"phx_dev_N": 1}' --labels phalanx.server=a|b|c --num-gpus 0``). A
node can crash (every process of its host SIGKILLed) and be started again.

Used by ``tests/cluster/test_ray_live.py`` and by ``phalanx chaos --engine ray``. Teardown
ends our Ray processes by their temp folders (never ``ray stop``: it would end every Ray
process of the machine), then removes the folders, then the namespaces."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from phalanx.cluster.core.clusters import resolve_cluster
from phalanx.cluster.core.topology import Topology
from phalanx.errors import PhalanxError
from phalanx.runtime import hosts

PORT = 6399
TOPOLOGY = "three-nodes"       # clusters.three_nodes: a | b, c in 2 racks, one device each
START_TIMEOUT_S = 120.0
ACTOR = "ray::RankActor"       # a device's actor (phalanx/cluster/live/engines/ray.py)


class RayClusterError(PhalanxError):
    """A node of the test cluster did not start, or the cluster left something behind
    (one line)."""


def ray_command() -> str:
    """The ``ray`` command next to this Python."""
    return str(Path(sys.executable).with_name("ray"))


def ray_env(root: Path) -> dict[str, str]:
    """Every ``ray start`` and the scheduler: no auth token (a ~/.ray/auth_token of this
    machine makes a joining node fail with InvalidAuthToken), no usage stats, and ``root``'s
    phalanx for the actors and the ranks they start. The GCS checks its nodes every 0.5 s,
    gives each check 1.5 s and calls a node dead after 4 failed checks (default: 3 s, 10 s,
    5): a crashed node (refused at once) is noticed in about 2 s, a cut-off one (every check
    runs out) in 7.5-8 s (41.5-42 s with the default 10 s timeout)."""
    return {**os.environ, "PYTHONPATH": str(root), "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0", "RAY_health_check_period_ms": "500",
            "RAY_health_check_timeout_ms": "1500", "RAY_health_check_failure_threshold": "4"}


def unavailable() -> str | None:
    """Why a Ray cluster of test hosts cannot be made here (a skip reason), or None."""
    if not Path(ray_command()).exists():
        return "no ray command next to this Python (pip install -e '.[ray]')"
    why = hosts.unavailable()
    return None if why is None else f"no test hosts: {why}"


def pids_with(text: str) -> list[int]:
    """Processes whose command line mentions ``text`` (an out folder, a node's temp)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            out.append(int(p.name))
    return out


def kill_and_wait(marker: str, timeout_s: float = 20.0) -> bool:
    """SIGKILL our Ray processes (their command lines name our temp folders); wait until
    they are gone."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = pids_with(marker)
        if not pids:
            return True
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    return not pids_with(marker)


def _argv0(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


class RayTestCluster:
    """A node per server of ``topology``, node i in test host i of ``net``; a node can
    crash (every process of its host killed) and start again. Unpacks as (net, address,
    topology)."""

    def __init__(self, net: hosts.TestNetwork, topology: Topology, marker: str,
                 root: Path) -> None:
        self.net, self.topology, self.marker, self.root = net, topology, marker, root
        self.address = f"{net.hosts[0].addr}:{PORT}"
        self.temps: list[str] = []          # every node's temp folder (removed at the end)
        self.node_temp: dict[int, str] = {}
        self._naming = threading.Lock()     # nodes started at once each name a folder

    def __iter__(self) -> Iterator:
        return iter((self.net, self.address, self.topology))

    def env(self) -> dict[str, str]:
        return ray_env(self.root)

    def start_node(self, i: int) -> None:
        """``ray start`` in host i, as a user starts node i (short --temp-dir: Ray's
        AF_UNIX socket paths under it must fit in 107 bytes). Nodes may join at once
        (from threads): each gets a temp folder of its own."""
        with self._naming:
            temp = f"{self.marker}-{len(self.temps)}"
            self.temps.append(temp)
            self.node_temp[i] = temp
        host, server = self.net.hosts[i], self.topology.servers[i]
        where = (["--head", "--port", str(PORT), "--include-dashboard", "false"] if i == 0
                 else ["--address", self.address])
        r = host.run([ray_command(), "start", *where, "--node-ip-address", host.addr,
                      "--num-cpus", "2", "--num-gpus", "0",
                      "--resources", json.dumps({f"phx_dev_{d}": 1 for d in server.devices}),
                      "--labels", f"phalanx.server={server.name}", "--temp-dir", temp,
                      "--disable-usage-stats"], env=self.env(), timeout=START_TIMEOUT_S,
                     check=False)
        if r.returncode != 0:
            last = (r.stderr.strip() or r.stdout.strip() or "no output").splitlines()[-1]
            raise RayClusterError(f"ray start on test host {i} exited {r.returncode}: "
                                  f"{last[:300]}")

    def raylet(self, i: int) -> int | None:
        """The pid of host i's raylet (None: none runs there)."""
        return next((p for p in self.net.hosts[i].pids() if _argv0(p).endswith("/raylet")),
                    None)

    def crash_node(self, i: int) -> list[int]:
        """SIGKILL every process of node i's host at once: its raylet, its Ray workers (the
        rank actors) and the ranks they started, as when the machine dies; their pids.
        (Killing the raylet alone left the ranks running for seconds.)"""
        return self.net.hosts[i].kill_all()

    def restart_node(self, i: int) -> None:
        """Node i again after a crash or after the cluster called it dead: what is left of
        it (Ray's log monitor stays after its raylet's death) ended, then ``ray start``."""
        kill_and_wait(self.node_temp[i])
        self.start_node(i)

    def actors(self) -> list[str]:
        """The device actors that run on the hosts now: 'host I: pid P'."""
        return [f"host {i}: pid {p}" for i, h in enumerate(self.net.hosts) for p in h.pids()
                if _argv0(p).startswith(ACTOR)]


@contextlib.contextmanager
def ray_test_cluster(root: Path, topology: str = TOPOLOGY) -> Iterator[RayTestCluster]:
    """A running :class:`RayTestCluster` of ``topology`` (a node per server), torn down on
    every exit path; :class:`RayClusterError` when a node does not start or something of
    it is left behind."""
    topo = resolve_cluster(topology, root)
    marker = f"/tmp/phxr{os.getpid() % 10**5}{random.randrange(10**4)}"
    net = hosts.TestNetwork(len(topo.servers)).__enter__()
    c = RayTestCluster(net, topo, marker, root)
    try:
        c.start_node(0)
        # the other nodes join the head at once: each ``ray start`` mostly waits for its
        # raylet to register (one after another they were a third of the set-up each)
        with ThreadPoolExecutor(max(1, len(topo.servers) - 1)) as pool:
            list(pool.map(c.start_node, range(1, len(topo.servers))))
        yield c
    finally:
        gone = kill_and_wait(marker)
        for t in c.temps:
            shutil.rmtree(t, ignore_errors=True)
        net.teardown()
    if not gone:
        raise RayClusterError("Ray processes of the test cluster were left behind")
    if any(Path(t).exists() for t in c.temps):
        raise RayClusterError("Ray's temp folders were left behind")


def wait_until(ready: Callable[[], bool], timeout_s: float, every_s: float = 0.2) -> bool:
    """Poll ``ready()`` until it is true or ``timeout_s`` passed; its last answer."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            return False
        time.sleep(every_s)
    return True

