"""The Slurm cluster ``--engine slurm`` schedules on: an existing one (``--slurm-partition``,
found as every Slurm command finds it: ``SLURM_CONF``, else ``/etc/slurm/slurm.conf``), or
a local one built from the ``--cluster`` topology for the demo and the tests.

**The local cluster** is one ``slurmctld`` and one ``slurmd`` per server of the topology,
all on this host (Debian's ``slurm-wlm`` is built for several ``slurmd`` per host: each
runs as ``slurmd -N NODE`` on its own ``Port=``, and ``%n`` gives each its own spool, log
and pid file), with ``munged`` on our own key and socket. Every daemon listens on
127.0.0.1 only (``CommunicationParameters=NoInAddrAny,NoCtldInAddrAny``) and every file
is in one temp folder (``/tmp/phalanx-slurm-*``: configuration, key, state, spool, logs,
the fake GPUs as character devices). The daemons run in their own session (a Ctrl-C at the
terminal reaches ``phalanx schedule``, which then stops them in order), each under a
subreaper (:mod:`slurm_reaper`) that reaps ``slurmd``'s job steps (no zombie is left) and
stops its daemon and the steps if ``phalanx schedule`` dies without its clean-up. Afterwards
nothing is left: jobs cancelled, daemons stopped, any process that still carries the
folder in its environment killed, the folder removed. Building it needs root (``slurmd``
runs jobs as their users, and ``mknod``).

Why several ``slurmd`` on one host rather than one network namespace per node: Debian's
build supports it (checked: the ``%n`` substitutions work and ``slurmctld`` takes several
nodes on one host name with their own ports), and it needs no veth, bridge or addresses
outside loopback, nothing to tear down but processes and a folder.

**On test hosts** (``hosts``: :class:`phalanx.runtime.hosts.TestHost`, network namespaces on
one bridge, made and torn down by the caller) the same cluster spans machines as a real one
does: node i's ``slurmd`` runs inside host i with ``NodeAddr=`` that host's address and
listens there only, ``slurmctld`` inside host 0 on host 0's address, ``munged`` outside
(its socket, like every file of the cluster, is shared through the file system). The
controller is reachable only from the hosts: Slurm's commands run inside host 0
(:attr:`SlurmTarget.where`), and so must ``phalanx schedule``. A gang spanning nodes then
forms its group across hosts, at the ``NodeAddr`` of its rank 0's node.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from phalanx.cluster.core.topology import Topology
from phalanx.cluster.live.engines.base import free_port
from phalanx.cluster.live.engines.slurm.conf import (
    AS_ADDR,
    DEVICE_MAJOR,
    MAX_LOCAL_SERVERS,
    PARTITION,
    LocalPorts,
    device_file,
    gres_lines,
    local_conf,
)
from phalanx.errors import ConfigError

NO_SLURM = ("--engine slurm needs Slurm: install slurm-wlm and munge "
            "(apt-get install slurm-wlm munge)")
CLIENTS = ("sbatch", "squeue", "scancel", "sinfo")
DAEMONS = ("slurmctld", "slurmd", "munged")
MARKER = "PHALANX_SLURM_CLUSTER"       # in every local daemon's (and so job's) environment
READY_TIMEOUT_S = 60.0
REAPER = Path(__file__).with_name("reaper.py")


@dataclass(frozen=True)
class SlurmTarget:
    """Where jobs go: the environment Slurm's commands need, and the partition."""

    partition: str
    env: dict[str, str] = field(default_factory=dict)
    folder: str = ""                 # a local cluster's folder ('' for an existing one)
    # what runs a command where the controller is reachable (on test hosts: inside host 0)
    where: tuple[str, ...] = ()


class Host(Protocol):
    """A test host (:class:`phalanx.runtime.hosts.TestHost`): its network namespace's name
    and its address."""

    name: str
    addr: str


def inside(host: Host) -> list[str]:
    """What runs a command in ``host``'s network namespace and nothing else: not ``ip netns
    exec``, which also mounts the namespace's own /sys, without the cgroup file system
    under it that ``slurmd`` needs (it refuses to start)."""
    return ["nsenter", f"--net=/run/netns/{host.name}"]


def missing(names: tuple[str, ...]) -> list[str]:
    return [n for n in names if shutil.which(n) is None]


def check_installed(local: bool) -> None:
    """One line naming what to install, before anything is made."""
    if missing(CLIENTS + (DAEMONS if local else ())):
        raise ConfigError(NO_SLURM)
    if local and os.geteuid() != 0:
        raise ConfigError("--engine slurm without --slurm-partition builds a local Slurm "
                          "cluster, which needs root (slurmd runs jobs as their users)")


def run(cmd: list[str], env: dict[str, str], timeout: float = 30.0
        ) -> subprocess.CompletedProcess[str]:
    """A Slurm command, its output kept; never raises on its exit code, nor when the
    controller does not answer in ``timeout`` (exit 124, as timeout(1) says it)."""
    try:
        return subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"{cmd[0]}: no answer in {timeout:g} s")


@contextlib.contextmanager
def slurm_cluster(topology: Topology, partition: str = "",
                  hosts: Sequence[Host] = ()) -> Iterator[SlurmTarget]:
    """The cluster to schedule on: ``partition`` of the existing one, or a local one (node
    i in test host ``hosts[i]`` when given, one per server)."""
    if partition:
        check_installed(local=False)
        yield SlurmTarget(partition)
        return
    check_installed(local=True)
    if len(topology.servers) > MAX_LOCAL_SERVERS:
        raise ConfigError(f"--cluster {topology.name}: a local Slurm cluster runs one slurmd "
                          f"per server, at most {MAX_LOCAL_SERVERS} (it has "
                          f"{len(topology.servers)}); name a real one with --slurm-partition")
    local = LocalSlurm(topology, hosts)
    try:
        local.start()
        yield local.target
    finally:
        local.stop()


class LocalSlurm:
    """The daemons and the folder of a local cluster (see the module's text)."""

    def __init__(self, topology: Topology, hosts: Sequence[Host] = ()) -> None:
        if hosts and len(hosts) != len(topology.servers):
            raise ValueError(f"{len(hosts)} test hosts for {len(topology.servers)} servers")
        self.topology, self.hosts = topology, list(hosts)
        # Slurm's commands run where slurmctld listens (inside host 0 on test hosts)
        self.where: tuple[str, ...] = tuple(inside(self.hosts[0])) if hosts else ()
        self.folder = Path(tempfile.mkdtemp(prefix="phalanx-slurm-"))
        self.env = {"SLURM_CONF": str(self.folder / "slurm.conf"),
                    MARKER: str(self.folder)}
        self.daemons: list[tuple[str, subprocess.Popen[bytes]]] = []

    @property
    def target(self) -> SlurmTarget:
        return SlurmTarget(PARTITION, self.env, str(self.folder), self.where)

    # ------------------------------------------------------------------ start
    def _write(self) -> None:
        f = self.folder
        # munged wants every user to reach its socket's folder (as on any Slurm host: a
        # user authenticates as who they are); the rest is root's alone
        f.chmod(0o711)
        for sub, mode in (("munge", 0o711), ("state", 0o700), ("log", 0o700),
                          ("dev", 0o700), ("spool", 0o700)):
            (f / sub).mkdir(mode=mode)
        key = f / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for d in range(self.topology.num_devices):
            os.mknod(device_file(f / "dev", d), 0o600 | 0o020000, os.makedev(DEVICE_MAJOR, d))
        # a test host has a port space of its own: every port is free there
        ports = LocalPorts(free_port(), tuple(free_port() for _ in self.topology.servers),
                           tuple(h.addr for h in self.hosts))
        (f / "slurm.conf").write_text(local_conf(self.topology, f, ports))
        (f / "gres.conf").write_text("\n".join(gres_lines(self.topology, f / "dev")) + "\n")

    def daemon_argv(self, argv: list[str], host: int | None = None) -> list[str]:
        """A daemon's command line: under its subreaper, inside test host ``host`` if any
        and named by its address there (``nsenter``, ``unshare``, ``sh`` exec: the
        subreaper's child is the daemon)."""
        if not self.hosts or host is None:
            return [sys.executable, "-I", str(REAPER), *argv]
        h = self.hosts[host]
        return [*inside(h), sys.executable, "-I", str(REAPER), *AS_ADDR, h.addr, *argv]

    def slurmd_argv(self, node: int) -> list[str]:
        """Node ``node``'s slurmd (in its test host, if any): started again by the tests."""
        return self.daemon_argv(["slurmd", "-D", "-N", self.topology.servers[node].name,
                                 "-f", str(self.folder / "slurm.conf")], node)

    def _client(self, cmd: list[str]) -> subprocess.CompletedProcess[str]:
        return run([*self.where, *cmd], self.env, 10)

    def _spawn(self, name: str, argv: list[str]) -> None:
        """A daemon in its own session, under a subreaper that dies with us."""
        with open(self.folder / "log" / f"{name}.out", "ab") as out:
            p = subprocess.Popen(argv, stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env={**os.environ, **self.env}, start_new_session=True)
        self.daemons.append((name, p))

    def _wait(self, what: str, ready) -> None:  # noqa: ANN001 - a predicate
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready():
            dead = [n for n, p in self.daemons if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise OSError(f"local Slurm cluster: {what} did not come up "
                              f"({'exited: ' + ', '.join(dead) if dead else 'timed out'}); "
                              f"logs in {self.folder}/log: {self._log_tail()}")
            time.sleep(0.1)

    def _log_tail(self) -> str:
        for name in ("slurmctld.out", "munged.out"):
            with contextlib.suppress(OSError):
                lines = [ln for ln in (self.folder / "log" / name).read_text().splitlines()
                         if "error" in ln.lower()]
                if lines:
                    return lines[-1][:200]
        return ""

    def start(self) -> None:
        f = self.folder
        self._write()
        sock = f / "munge" / "munge.socket"
        # outside the test hosts, if any: its socket is a file, which every host reaches
        self._spawn("munged", self.daemon_argv([
            "munged", "-F", f"--socket={sock}", f"--key-file={f}/munge.key",
            f"--pid-file={f}/munged.pid", f"--seed-file={f}/munged.seed",
            f"--log-file={f}/log/munged.log", "--num-threads=2"]))
        self._wait("munged", sock.exists)
        conf = str(f / "slurm.conf")
        self._spawn("slurmctld", self.daemon_argv(["slurmctld", "-D", "-i", "-f", conf], 0))
        self._wait("slurmctld", lambda: self._client(["sinfo", "-h"]).returncode == 0)
        for i, s in enumerate(self.topology.servers):
            self._spawn(f"slurmd-{s.name}", self.slurmd_argv(i))
        names = {s.name for s in self.topology.servers}
        self._wait("every slurmd", lambda: self._idle() == names)

    def _idle(self) -> set[str]:
        r = self._client(["sinfo", "-h", "-N", "-o", "%N %t"])
        return {ln.split()[0] for ln in r.stdout.splitlines() if ln.split()[1:] == ["idle"]}

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        """Jobs, then daemons, then stragglers, then the folder; each step bounded."""
        try:
            if any(n == "slurmctld" and p.poll() is None for n, p in self.daemons):
                self._cancel_all()
            for group in ("slurmd-", "slurmctld", "munged"):
                procs = [p for n, p in self.daemons if n.startswith(group)]
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGTERM)
                for p in procs:
                    try:
                        p.wait(10)
                    except subprocess.TimeoutExpired:
                        self._kill_marked()
                        p.kill()
                        p.wait()
            self._kill_marked()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _cancel_all(self) -> None:
        jobs = [ln.split() for ln in self._client(["squeue", "-h", "-o", "%A %T"])
                .stdout.splitlines()]
        running = [j[0] for j in jobs if j[1:] != ["PENDING"]]
        pending = [j[0] for j in jobs if j[1:] == ["PENDING"]]
        if running:   # the batch step (a cancel would wait KillWait before the KILL)
            self._client(["scancel", "--batch", "--signal=KILL", *running])
        if pending:
            self._client(["scancel", *pending])
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and self._client(["squeue", "-h", "-o",
                                                            "%A"]).stdout.split():
            time.sleep(0.1)

    def _kill_marked(self) -> None:
        """SIGKILL every process but our daemons whose environment carries this cluster's
        marker (a step or rank that outlived its slurmd), and wait until none is left (the
        reapers then reap them)."""
        mark = f"{MARKER}={self.folder}".encode()
        exclude = {p.pid for _, p in self.daemons}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            left = [pid for pid in marked_pids(mark) if pid not in exclude]
            if not left:
                return
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)


def marked_pids(mark: bytes) -> list[int]:
    """Live processes (not this one) whose environment holds ``mark``."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if mark in (proc / "environ").read_bytes():
                out.append(int(proc.name))
        except OSError:
            continue
    return out
