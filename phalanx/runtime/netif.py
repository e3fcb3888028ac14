"""Which network interface a rank's gloo device binds: decided once, at the entry point.

Left to itself gloo binds the address the machine's host name resolves to. On many Debian
machines and containers that is 127.0.0.1 (or 127.0.1.1): every rank then advertises
loopback to its peers on other machines and the full-mesh connect fails with "Connection
refused". So the entry point picks the interface the kernel would use to reach the
rendezvous (master) address, the one the other machines are reachable through, and hands
it to gloo as ``GLOO_SOCKET_IFNAME`` (the only knob ``init_process_group`` reads for gloo).
Gloo then binds that interface's address only, never all interfaces.

Order of precedence: ``--iface`` > ``GLOO_SOCKET_IFNAME`` already in the environment > the
route to the master address. A single-host run (every rank on this machine) binds ``lo``
when its master address is loopback or the group meets through torchrun's agent; one whose
ranks meet at the master address itself (``phalanx schedule``) binds the interface holding
it (the address the other ranks connect to).
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from dataclasses import dataclass

from phalanx.errors import PhalanxError

_SIOCGIFADDR = 0x8915


@dataclass(frozen=True)
class Binding:
    """Where this rank's gloo device listens and why."""

    iface: str
    addr: str  # the interface's IPv4 address ("" when the interface has none we can read)
    reason: str  # "--iface", "GLOO_SOCKET_IFNAME", "route to MASTER", "single host"


def iface_addr(iface: str) -> str:
    """The IPv4 address of ``iface`` ("" when it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR,
                                 struct.pack("256s", iface.encode()[:15]))
        except OSError:
            return ""
    return socket.inet_ntoa(packed[20:24])


def route_source(dest: str) -> str:
    """The local address the kernel would send from to reach ``dest`` (no packet is sent:
    connecting a UDP socket only looks up the route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((dest, 9))
        return s.getsockname()[0]


def iface_with_addr(addr: str) -> str | None:
    """The interface that holds ``addr``."""
    for _, name in socket.if_nameindex():
        if iface_addr(name) == addr:
            return name
    return None


def resolve(host: str) -> str:
    """``host`` as an IPv4 address."""
    try:
        return socket.gethostbyname(host)
    except OSError as e:
        raise PhalanxError(f"master address {host!r} does not resolve: {e}") from None


def local_addrs() -> dict[str, str]:
    """This host's IPv4 addresses: {address: interface}."""
    found: dict[str, str] = {}
    for _, name in socket.if_nameindex():
        addr = iface_addr(name)
        if addr:
            found.setdefault(addr, name)
    return found


def choose(master: str, *, multi_host: bool, iface: str = "", env_iface: str = "",
           at_master: bool = False, serves: bool = False) -> Binding:
    """The interface for gloo: see the module docstring for the precedence.

    ``multi_host``: the run spans several machines (torchrun's WORLD_SIZE > LOCAL_WORLD_SIZE).
    A multi-host run whose master address is loopback cannot work (the other machines would
    be told 127.0.0.1), so it fails here with what to change, instead of hanging later.

    ``at_master``: the group meets at the master address itself (rank 0's store there, no
    torchrun agent: ``phalanx schedule``). Every rank then binds where the others will
    connect: a master address that is one of this host's non-loopback addresses (what an
    engine such as Ray hands out: the node's IP) is bound on its interface even when every
    rank is on this host. (Under torchrun's agent a single-host group's own store is
    published through the agent's: loopback serves it.) ``serves``: this rank hosts the
    group's store at the master address (rank 0 under ``phalanx schedule``): a master
    address this host does not hold is an error at once, not a peer's timeout later.
    """
    if iface or env_iface:
        name = iface or env_iface
        flag = "--iface" if iface else "GLOO_SOCKET_IFNAME"
        if name not in {n for _, n in socket.if_nameindex()}:
            names = ", ".join(n for _, n in socket.if_nameindex())
            raise PhalanxError(f"{flag} {name!r}: no such interface here (have {names})")
        binding = Binding(name, iface_addr(name), flag)
        if serves:
            master_ip = resolve(master)
            if not ipaddress.ip_address(master_ip).is_loopback and master_ip != binding.addr:
                raise PhalanxError(
                    f"{flag} {name} ({binding.addr or 'no address'}) is not MASTER_ADDR "
                    f"{master} ({master_ip}), where the other ranks look for rank 0's store")
        return binding
    master_ip = resolve(master)
    loopback = ipaddress.ip_address(master_ip).is_loopback
    if loopback and not multi_host:  # every peer is on this machine and told loopback
        return Binding("lo", "127.0.0.1", "single host")
    if loopback:
        raise PhalanxError(
            f"the run spans several machines but the master address {master!r} is loopback "
            f"({master_ip}): give torchrun --local-addr <this machine's address> (torchrun "
            "advertises rank 0's host name, which resolves to loopback here)")
    mine = local_addrs()
    if master_ip in mine and (at_master or serves or multi_host):
        # the others connect to this host at the master address
        return Binding(mine[master_ip], master_ip, f"MASTER_ADDR {master_ip} is this host's")
    if serves:
        have = ", ".join(f"{a} ({n})" for a, n in mine.items())
        raise PhalanxError(f"rank 0 serves the group at MASTER_ADDR {master} ({master_ip}), "
                           f"which is not an address of this host (have {have})")
    if not multi_host:  # torchrun's agent store elsewhere; the group's own is on lo
        return Binding("lo", "127.0.0.1", "single host")
    try:
        source = route_source(master_ip)
    except OSError as e:    # e.g. this host's link is down (a partition): no route at all
        raise PhalanxError(f"no route from this host to the master {master} ({master_ip}): "
                           f"{(e.strerror or str(e)).lower()}") from None
    name = iface_with_addr(source)
    if name is None:
        raise PhalanxError(f"no interface holds {source}, the address that routes to the "
                           f"master {master} ({master_ip}); name one with --iface")
    return Binding(name, source, f"route to {master_ip}")
