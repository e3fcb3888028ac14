"""Test hosts on one machine: network namespaces joined by a bridge, links shaped with tbf.

Each host is a network namespace with its own loopback and one interface ``eth0`` holding
``10.231.X.(i+1)/24``; its peer end sits on a bridge in a namespace of its own, so the
hosts reach each other only through that bridge and every byte between two hosts crosses
two veth interfaces whose kernel counters (``/sys/class/net/eth0/statistics``) count it.
Nothing is added to the machine's own namespace: the addresses are private to the bridge.

Names are ``phx-<pid>-...`` (the creating process's id) so parallel runs never collide and a
later run removes the leftovers of a killed one (only those whose creator is dead).
``netem`` (delay, loss) is not available on our kernels; ``tbf`` (a rate) is.

TCP between the hosts runs CUBIC (:data:`TCP_CONGESTION`, set on each host's route to the
others: a namespace may not choose its own default here), not whatever the machine's
default is. This machine's is BBR, whose bandwidth estimate collapses now and then on a
tbf link (a bucket's burst at line rate, then the rate): the MLP's ZeRO-3 at N = 2, 100
Mbit/s ran 50.4 ms a step with spells of 70-97 ms lasting seconds under BBR, and 50.4 ms
every step of four runs under CUBIC (docs/scale.md). CUBIC is Linux's own default, and
what most clusters run.

Needs root (CAP_NET_ADMIN) and ``ip``/``tc``; :func:`unavailable` says why not, for a skip.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from phalanx.errors import PhalanxError

PREFIX = "phx-"
TCP_CONGESTION = "cubic"  # between test hosts (the module); the system's if it lacks it
_NAME = re.compile(rf"^{PREFIX}(\d+)-")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def pids_in_netns(ns: str) -> list[int]:
    """Every process whose network namespace is ``ns`` ('net:[inode]'), from /proc."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.readlink(f"/proc/{entry.name}/ns/net") == ns:
                    found.append(int(entry.name))
            except OSError:  # ended meanwhile, or not ours to read
                continue
    return sorted(found)


def _no_ipv6(ns: str, dev: str) -> None:
    """No IPv6 on the test links: its neighbour discovery would add bytes nobody sent."""
    subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw",
                    f"net.ipv6.conf.{dev}.disable_ipv6=1"], capture_output=True, check=False)


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def remove_stale() -> list[str]:
    """Delete ``phx-<pid>-*`` namespaces whose creating process is gone (killed runs)."""
    removed = []
    listing = _ip("netns", "list", check=False).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NAME.match(name)
        if m and not _alive(int(m.group(1))):
            _ip("netns", "delete", name, check=False)
            removed.append(name)
    return removed


def unavailable() -> str | None:
    """Why test hosts cannot be made here (a skip reason), or None when they can."""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed"
    probe = f"{PREFIX}{os.getpid()}-probe{random.randrange(10**6)}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip() or 'ip netns add failed'}"
    _ip("netns", "delete", probe, check=False)
    return None


def congestion_controls() -> list[str]:
    """The kernel's TCP congestion controls (what a test network's ``tcp`` may name)."""
    try:
        return Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    except OSError:
        return []


def congestion_control(tcp: str = "") -> str:
    """The TCP congestion control test hosts run: ``tcp`` if given, else
    :data:`TCP_CONGESTION` where the kernel has it, else the machine's default (what each
    run records)."""
    if tcp:
        return tcp
    if TCP_CONGESTION in congestion_controls():
        return TCP_CONGESTION
    try:
        return Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    except OSError:
        return "unknown"


def tbf_args(rate_mbit: float) -> list[str]:
    """tbf parameters for ``rate_mbit``: a bucket of ~20 ms of traffic (at least 128 KiB, so
    a 64 KiB GSO segment always fits) and a queue of ~100 ms before drops."""
    rate_bytes = rate_mbit * 1e6 / 8
    burst = max(128 * 1024, int(rate_bytes * 0.02))
    return ["rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "100ms"]


@dataclass
class TestHost:
    """One test host: a namespace with ``lo`` and ``eth0`` (``addr``)."""

    __test__ = False  # not a pytest test class

    name: str
    addr: str
    iface: str = "eth0"

    def argv(self, command: list[str]) -> list[str]:
        """``command`` run inside this host (``ip netns exec`` also gives it this host's /sys)."""
        return ["ip", "netns", "exec", self.name, *command]

    def run(self, command: list[str], **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.argv(command), **kwargs)

    def popen(self, command: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.argv(command), **kwargs)

    def netns(self) -> str:
        """This host's network namespace as /proc/PID/ns/net names it ('net:[inode]')."""
        return f"net:[{os.stat(f'/run/netns/{self.name}').st_ino}]"

    def pids(self) -> list[int]:
        """The processes running in this host: those whose network namespace is this
        host's (what ``ip netns pids`` prints, read here without starting a process: the
        tests sample hosts several times a second)."""
        return pids_in_netns(self.netns())

    def processes(self) -> list[str]:
        """The command lines of the processes running in this host. A process part-way
        through exiting (its memory already released, its namespaces not yet) has an empty
        command line: it is not running, and is left out."""
        found = []
        for pid in self.pids():
            try:
                line = (Path(f"/proc/{pid}/cmdline").read_bytes()
                        .replace(b"\0", b" ").decode(errors="replace").strip())
            except OSError:
                continue
            if line:
                found.append(line)
        return found

    def kill_all(self) -> list[int]:
        """SIGKILL every process in this host (a machine lost at once); their pids."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def link_down(self) -> None:
        """Cut this host off (a network partition, not a crash): its ``eth0`` goes down,
        its processes run on and the others see silence, not refused connections."""
        _ip("-n", self.name, "link", "set", self.iface, "down")

    def link_up(self) -> None:
        """Join the bridge again (the kernel restores the address's route)."""
        _ip("-n", self.name, "link", "set", self.iface, "up")

    def tx_bytes(self) -> int:
        """Bytes this host has sent on ``eth0``, as the kernel counts them."""
        return self._stat("tx_bytes")

    def rx_bytes(self) -> int:
        return self._stat("rx_bytes")

    def _stat(self, what: str) -> int:
        out = self.run(["cat", f"/sys/class/net/{self.iface}/statistics/{what}"], check=True)
        return int(out.stdout)

    def listening(self) -> list[Listener]:
        """Every listening TCP socket of this host (from /proc/net/tcp{,6} as the host sees
        them) with the processes that hold it (found through /proc/PID/fd; ``cmdline``
        joins the holders' command lines with " | ")."""
        pids = self.pids()
        owners = self._socket_owners(pids)
        found = []
        for table, width in (("tcp", 8), ("tcp6", 32)):
            # /proc/PID/net is the view of PID's network namespace: that of any process in
            # the host will do (a host without a process holds no socket)
            text = ""
            for pid in pids:
                try:
                    text = Path(f"/proc/{pid}/net/{table}").read_text()
                    break
                except OSError:  # it ended meanwhile: the next one
                    continue
            for line in text.splitlines()[1:]:
                cols = line.split()
                if len(cols) > 9 and cols[3] == "0A":  # TCP_LISTEN
                    hexaddr, hexport = cols[1].split(":")
                    pid, cmd = owners.get(cols[9], (0, ""))
                    found.append(Listener(_decode_addr(hexaddr[:width]), int(hexport, 16),
                                          pid, cmd))
        return found

    def _socket_owners(self, pids: list[int]) -> dict[str, tuple[int, str]]:
        owners = {}
        for pid in pids:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        # a socket inherited by a child is held by both: list every holder
                        held = owners.get(link[8:-1])
                        owners[link[8:-1]] = (held[0] if held else int(pid), cmd.strip()
                                              if not held else f"{held[1]} | {cmd.strip()}")
            except OSError:  # the process ended meanwhile
                continue
        return owners


@dataclass(frozen=True)
class Listener:
    addr: str
    port: int
    pid: int
    cmdline: str


def _decode_addr(hexaddr: str) -> str:
    """/proc/net/tcp's address: 32-bit words in host (little-endian) byte order."""
    import ipaddress

    raw = bytes.fromhex(hexaddr)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


@dataclass
class TestNetwork:
    """``k`` test hosts on one bridge; use as a context manager (teardown even on errors).

    ``rate_mbit`` shapes every host's link in both directions (tbf on the host's ``eth0`` and
    on its port of the bridge), as a switch port of that speed would.
    """

    __test__ = False

    k: int
    rate_mbit: float | None = None
    subnet: int = field(default_factory=lambda: random.randrange(1, 255))
    hosts: list[TestHost] = field(default_factory=list)
    # the names' prefix; default: this process's (torn down with it, or by a later run)
    tag: str = ""
    # TCP congestion control between the hosts ("": :func:`congestion_control`'s choice)
    tcp: str = ""
    _bridge_ns: str = ""
    _made: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        tag = self.tag or f"{PREFIX}{os.getpid()}-{random.randrange(16**6):06x}"
        self._bridge_ns = f"{tag}-br"
        self.hosts = [TestHost(f"{tag}-h{i}", f"10.231.{self.subnet}.{i + 1}")
                      for i in range(self.k)]

    def __enter__(self) -> TestNetwork:
        remove_stale()
        try:
            self._up()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def _up(self) -> None:
        br = self._bridge_ns
        _ip("netns", "add", br)
        self._made.append(br)
        _ip("-n", br, "link", "add", "br0", "type", "bridge")
        _no_ipv6(br, "br0")
        _ip("-n", br, "link", "set", "br0", "up")
        _ip("-n", br, "link", "set", "lo", "up")
        cc = congestion_control(self.tcp)  # on each host's route to the others, if known
        for i, host in enumerate(self.hosts):
            _ip("netns", "add", host.name)
            self._made.append(host.name)
            port = f"p{i}"
            _ip("link", "add", port, "netns", br, "type", "veth",
                "peer", "name", host.iface, "netns", host.name)
            _ip("-n", br, "link", "set", port, "master", "br0")
            _ip("-n", br, "link", "set", port, "up")
            _ip("-n", host.name, "link", "set", "lo", "up")
            _no_ipv6(host.name, host.iface)
            _ip("-n", host.name, "addr", "add", f"{host.addr}/24", "dev", host.iface)
            _ip("-n", host.name, "link", "set", host.iface, "up")
            if cc in congestion_controls():
                _ip("-n", host.name, "route", "replace", f"10.231.{self.subnet}.0/24", "dev",
                    host.iface, "congctl", cc)
        if self.rate_mbit is not None:
            self.shape(self.rate_mbit)

    @property
    def bridge_ns(self) -> str:
        return self._bridge_ns

    def ports(self) -> dict[str, str]:
        """Host address -> the name of its port on the bridge (inside ``bridge_ns``)."""
        return {host.addr: f"p{i}" for i, host in enumerate(self.hosts)}

    def shape(self, rate_mbit: float) -> None:
        """Limit every link to ``rate_mbit`` in both directions (replaces earlier shaping)."""
        for i, host in enumerate(self.hosts):
            for ns, dev in ((host.name, host.iface), (self._bridge_ns, f"p{i}")):
                subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
                                *tbf_args(rate_mbit)], check=True, capture_output=True)
        self.rate_mbit = rate_mbit

    def teardown(self) -> None:
        """End what still runs inside our hosts, then delete every namespace we made (their
        veths go with them). A namespace outlives its deletion while a process is in it."""
        while self._made:
            name = self._made.pop()
            for pid in _ip("netns", "pids", name, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "delete", name, check=False)


RDZV_PORT = 29400  # inside the test hosts every port is free: each has its own port space


def torchrun_argv(net: TestNetwork, node: int, nproc: int, target: list[str], *,
                  nnodes: str = "", max_restarts: int = 0, run_id: str = "phalanx",
                  log_dir: Path | None = None) -> list[str]:
    """The ``torchrun`` command a user would type on test host ``node`` (the phalanx rendezvous on
    host 0). ``--local-addr``: torchrun otherwise advertises the host name, which resolves to
    127.0.0.1 here; ``is_host``: torchrun recognises the rendezvous host by its host name or
    addresses, and all test hosts share one host name. ``log_dir``: torchrun's own folder
    (its per-attempt error files); without ``--log-dir`` torchrun makes a
    ``torchelastic_*`` folder in the temp folder and never removes it."""
    import sys

    host = net.hosts[node]
    logs = ["--log-dir", str(log_dir)] if log_dir is not None else []
    return [sys.executable, "-m", "torch.distributed.run", *logs,
            "--nnodes", nnodes or str(len(net.hosts)), "--nproc-per-node", str(nproc),
            "--rdzv-backend", "phalanx", "--rdzv-endpoint", f"{net.hosts[0].addr}:{RDZV_PORT}",
            "--rdzv-id", run_id,
            "--rdzv-conf", f"is_host={int(node == 0)},last_call_timeout=2",
            "--local-addr", host.addr, "--max-restarts", str(max_restarts),
            "--monitor-interval", "0.2", *target]


def start_torchrun(net: TestNetwork, nproc: int, target: list[str], log_dir: Path, *,
                   nodes: list[int] | None = None, env: dict[str, str] | None = None,
                   **kwargs) -> list[subprocess.Popen]:
    """Start torchrun on every host (or ``nodes``); output goes to ``log_dir/host<i>.log``,
    torchrun's own files to ``log_dir/torchelastic-host<i>`` (not the temp folder)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for node in (range(len(net.hosts)) if nodes is None else nodes):
        with open(log_dir / f"host{node}.log", "w") as out:
            procs.append(net.hosts[node].popen(
                torchrun_argv(net, node, nproc, target,
                              log_dir=log_dir / f"torchelastic-host{node}", **kwargs),
                stdout=out,
                stderr=subprocess.STDOUT, text=True,
                env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                start_new_session=True))
    return procs


# ``phalanx hosts up N`` / ``down``: hosts that outlive the command, for trying multi-node
# runs by hand (docs/multi-node.md). Their prefix is not a creator's pid, so the tests'
# clean-up of dead runs' namespaces (remove_stale) leaves them alone.
KEPT = "phxh"
KEPT_SUBNET = 250
MAX_KEPT = 16


def kept_hosts() -> list[str]:
    """Names of the kept test hosts' namespaces (bridge included), as ``ip`` lists them."""
    listing = _ip("netns", "list", check=False).stdout
    return sorted(line.split()[0] for line in listing.splitlines()
                  if line.split() and line.split()[0].startswith(f"{KEPT}-"))


def hosts_up(k: int, rate_mbit: float | None = None) -> list[TestHost]:
    """Make ``k`` kept test hosts ``phxh-h0..`` at ``10.231.250.1..`` on one bridge."""
    why = unavailable()
    if why:
        raise HostsError(f"cannot make test hosts here: {why}")
    if not 1 <= k <= MAX_KEPT:
        raise HostsError(f"hosts up: {k} is not in 1..{MAX_KEPT}")
    if kept_hosts():
        raise HostsError("test hosts are up already (phalanx hosts down first)")
    net = TestNetwork(k, rate_mbit, subnet=KEPT_SUBNET, tag=KEPT)
    try:
        net._up()
    except BaseException:
        net.teardown()
        raise
    return net.hosts


def hosts_down() -> list[str]:
    """Delete the kept test hosts (ending what runs in them); their names."""
    names = kept_hosts()
    net = TestNetwork(0, tag=KEPT)
    net._made = list(names)  # teardown empties the list it is given
    net.teardown()
    return names


class HostsError(PhalanxError):
    """Kept test hosts cannot be made or are up already (one line)."""
