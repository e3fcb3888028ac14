"""The network layer: links per level of the scheduler's topology and the alpha-beta time of
a phase of concurrent flows over them.

A cluster is the scheduler's topology (zones > racks > servers > devices,
``phalanx.cluster.core.topology``) plus one :class:`Link` per level:

* ``intra``: device to device inside a server (NVLink / PCIe / shared memory);
* ``nic``: a server's network interface, one per server, full duplex;
* ``rack``: a rack's uplink to the zone switch; by default the sum of its servers' NICs
  divided by the level's ``oversubscription``;
* ``zone``: a zone's uplink to the core, the sum of its racks' uplinks / oversubscription.

A *phase* is a set of flows that run at the same time (one step of a ring, a round of
pushes to the shards). Its time is the fluid (max-min, bottleneck) model: every directed
resource (a device's intra port, a NIC's out or in side, a rack's or zone's up or down link)
carries the bytes of every flow that crosses it; the phase takes

    max over paths of the latency crossed  +  max over resources of bytes / bandwidth

and the resource that sets the second term is the phase's bottleneck. That is the alpha-beta
model of SimAI's and ASTRA-sim's analytical back ends, with the topology's sharing
(incast onto one NIC, many flows through one oversubscribed uplink) counted exactly.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from phalanx.cluster.core.cluster_file import topology_from_mapping
from phalanx.cluster.core.topology import Topology, uniform
from phalanx.errors import ConfigError

LEVELS = ("intra", "nic", "rack", "zone")


@dataclass(frozen=True, kw_only=True)
class Link:
    """One level's link: bandwidth in bytes/s, one-way latency (alpha) in seconds, and the
    oversubscription of the uplinks above it (1: full bisection)."""

    bandwidth: float
    latency: float = 0.0
    oversubscription: float = 1.0
    # a token bucket (tc tbf's burst): bytes that pass at line rate after an idle gap
    burst: float = 0.0
    # bandwidth left per direction when both directions are busy (1: a full-duplex link;
    # below 1 where the data of one direction queues behind the other's ACKs, as on tbf)
    duplex: float = 1.0
    # a host's sends of one message to each of several peers at once (the main node's
    # broadcast): (bytes, the share that went one after the other, 0..1) as calibrated
    # (``calibrate.fit_fanout``), by size; () : they share the link fairly (fluid)
    fanout: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:
            raise ConfigError(f"link bandwidth must be > 0 bytes/s, got {self.bandwidth!r}")
        if not self.latency >= 0:
            raise ConfigError(f"link latency must be >= 0 s, got {self.latency!r}")
        if not (self.burst >= 0 and 0 < self.duplex <= 1):
            raise ConfigError(f"link burst must be >= 0 and duplex in (0, 1], got "
                              f"{self.burst!r}, {self.duplex!r}")
        if not self.oversubscription >= 1:
            raise ConfigError(f"link oversubscription must be >= 1, got "
                              f"{self.oversubscription!r}")
        if not all(b > 0 and 0 <= x <= 1 for b, x in self.fanout):
            raise ConfigError(f"link fanout must be (bytes > 0, share in [0, 1]) pairs, got "
                              f"{self.fanout!r}")

    def in_turn(self, nbytes: float) -> float:
        """The share of a fan-out of ``nbytes`` to each peer that goes one peer after the
        other (0: fair sharing): the calibrated sizes' shares, linear in log(bytes)
        between them, the nearest's beyond them."""
        pts = self.fanout
        if not pts or nbytes <= 0:
            return 0.0
        if nbytes <= pts[0][0]:
            return pts[0][1]
        for (b0, x0), (b1, x1) in zip(pts, pts[1:]):
            if nbytes <= b1:
                w = math.log(nbytes / b0) / math.log(b1 / b0)
                return x0 + w * (x1 - x0)
        return pts[-1][1]


def gbit(rate: float) -> float:
    """Gbit/s -> bytes/s."""
    return rate * 1e9 / 8


@dataclass(frozen=True, kw_only=True)
class Links:
    """The four levels' links. Defaults: NVLink-class inside a server, 25 GbE NICs, no
    oversubscription (the Horovod paper's cluster)."""

    intra: Link = Link(bandwidth=gbit(1200), latency=2e-6)
    nic: Link = Link(bandwidth=gbit(25), latency=10e-6)
    rack: Link = Link(bandwidth=gbit(25), latency=5e-6)
    zone: Link = Link(bandwidth=gbit(25), latency=5e-6)

    def of(self, level: str) -> Link:
        return getattr(self, level)


# a phase's flow: (source device, destination device, bytes); a device id >= the topology's
# devices is a CPU-only server's (a parameter-server shard on a machine of its own)
Flow = tuple[int, int, float]


@dataclass(frozen=True)
class PhaseCost:
    """Time of one phase, its bottleneck resource's level, bytes by level, and the time the
    bottleneck's token bucket saves when the phase starts after an idle gap (``credit_s``:
    the first phase of an exchange that follows compute; ``burst_s``: the bucket's whole
    credit, the burst at the bottleneck's rate: what phases back to back can share)."""

    seconds: float
    bottleneck: str
    bytes_by_level: Mapping[str, float] = field(default_factory=dict)
    credit_s: float = 0.0
    burst_s: float = 0.0
    refill_s: float = 0.0   # tokens (as line-rate time) the latency's idle link refills
    wire_s: float = 0.0     # the bottleneck's bytes / its rate


class Network:
    """A topology and its links; ``extra_servers`` CPU-only machines hang off the core (each
    its own NIC, in a rack of its own with an uplink that is not oversubscribed)."""

    def __init__(self, topology: Topology, links: Links, extra_servers: int = 0,
                 extra_nic_scale: float = 1.0) -> None:
        self.topology, self.links = topology, links
        self.devices = topology.num_devices
        self.extra = extra_servers
        # a representative CPU-only server standing for k identical ones carries k NICs
        self.extra_nic_scale = extra_nic_scale
        t = topology
        self._server = list(t.device_server)
        self._rack = [t.server_rack[s] for s in range(len(t.servers))]
        self._zone = [t.rack_zone[r] for r in range(len(t.racks))]
        nic = links.nic.bandwidth
        rack_servers = [len(r.servers) for r in t.racks]
        self._rack_cap = [n * nic / links.rack.oversubscription for n in rack_servers]
        zone_cap = [0.0] * len(t.zones)
        for r, cap in enumerate(self._rack_cap):
            zone_cap[self._zone[r]] += cap
        self._zone_cap = [c / links.zone.oversubscription for c in zone_cap]

    def with_extra(self, extra_servers: int, nic_scale: float = 1.0) -> Network:
        return Network(self.topology, self.links, extra_servers, nic_scale)

    def server_of(self, device: int) -> int:
        if device < self.devices:
            return self._server[device]
        if device >= self.devices + self.extra:
            raise ConfigError(f"device {device} is not in cluster {self.topology.name!r}")
        return len(self.topology.servers) + device - self.devices

    def path(self, src: int, dst: int) -> tuple[list[tuple[str, int, str]], float]:
        """The directed resources a flow crosses, (level, index, direction), and its
        latency."""
        s, d = self.server_of(src), self.server_of(dst)
        L = self.links
        if s == d:
            return [("intra", src, "out"), ("intra", dst, "in")], L.intra.latency
        hops = [("nic", s, "out"), ("nic", d, "in")]
        lat = L.nic.latency
        rs, rd = self._rack_of_server(s), self._rack_of_server(d)
        if rs != rd:
            hops += [("rack", rs, "up"), ("rack", rd, "down")]
            lat += L.rack.latency
            zs, zd = self._zone_of_rack(rs), self._zone_of_rack(rd)
            if zs != zd:
                hops += [("zone", zs, "up"), ("zone", zd, "down")]
                lat += L.zone.latency
        return hops, lat

    def _rack_of_server(self, s: int) -> int:
        # a CPU-only server is a rack of its own (negative ids never meet a real rack)
        return self._rack[s] if s < len(self._rack) else -1 - s

    def _zone_of_rack(self, r: int) -> int:
        return self._zone[r] if r >= 0 else -1  # extra servers sit at the core: zone -1

    def capacity(self, level: str, index: int) -> float:
        if level == "nic" and index >= len(self.topology.servers):
            return self.links.nic.bandwidth * self.extra_nic_scale
        if level in ("intra", "nic"):
            return self.links.of(level).bandwidth
        if level == "rack":
            return self._rack_cap[index] if index >= 0 else float("inf")
        return self._zone_cap[index] if index >= 0 else float("inf")

    def phase(self, flows: Iterable[Flow]) -> PhaseCost:
        """Time of a set of concurrent flows (fluid model, see the module's docstring)."""
        load: dict[tuple[str, int, str], float] = defaultdict(float)
        by_level: dict[str, float] = defaultdict(float)
        latency = 0.0
        for src, dst, nbytes in flows:
            if nbytes <= 0 or src == dst:
                continue
            hops, lat = self.path(src, dst)
            latency = max(latency, lat)
            for hop in hops:
                load[hop] += nbytes
            # bytes by level counted once per flow, at the highest level it crosses
            by_level[hops[-1][0]] += nbytes
        if not load:
            return PhaseCost(0.0, "none", {})
        nic = self.links.nic

        def cap(k: tuple[str, int, str]) -> float:
            c = self.capacity(k[0], k[1])
            if k[0] == "nic" and nic.duplex < 1:  # both directions busy at once
                other = (k[0], k[1], "in" if k[2] == "out" else "out")
                if load.get(other, 0.0) > 0:
                    c *= nic.duplex
            return c

        # ties go to the lowest level (a NIC saturated as much as its uplink is the news)
        worst, _, key = max((b / cap(k), -LEVELS.index(k[0]), k) for k, b in load.items())
        burst = self.links.of(key[0]).burst
        if key[0] == "nic" and key[1] >= len(self.topology.servers):
            burst *= self.extra_nic_scale  # S machines merged into one: S buckets
        rate = self.capacity(key[0], key[1])
        credit = min(burst, load[key]) / rate if burst else 0.0
        # what the bucket refills while this phase's latency keeps its link idle, and its
        # bytes take back at line rate (at most the bucket, at most the bytes' time): used
        # where phases follow one another (collectives._repeat)
        refill = min(latency, worst, burst / rate) if burst else 0.0
        return PhaseCost(latency + worst, key[0], dict(by_level), credit, burst / rate,
                         refill, worst)


# ----------------------------------------------------------------------------- YAML

def links_from_mapping(data: Any, where: str) -> Links:
    """``links: {nic: {gbit: 25, latency_us: 10}, rack: {oversubscription: 4}, ...}``."""
    if data is None:
        return Links()
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: links must be a mapping of level -> link")
    unknown = set(data) - set(LEVELS)
    if unknown:
        names = ", ".join(sorted(map(str, unknown)))
        raise ConfigError(f"{where}: links: unknown level(s) {names} (levels: "
                          f"{', '.join(LEVELS)})")
    base = Links()
    out: dict[str, Link] = {}
    for level in LEVELS:
        entry = data.get(level)
        old = base.of(level)
        if entry is None:
            out[level] = old
            continue
        if not isinstance(entry, Mapping) or set(entry) - {"gbit", "latency_us",
                                                           "oversubscription"}:
            raise ConfigError(f"{where}: links.{level} must be a mapping with gbit, "
                              f"latency_us, oversubscription")
        if "gbit" in entry and isinstance(entry["gbit"], bool):
            raise ConfigError(f"{where}: links.{level}.gbit must be a number")
        try:
            bw = gbit(float(entry["gbit"])) if "gbit" in entry else old.bandwidth
            lat = float(entry["latency_us"]) * 1e-6 if "latency_us" in entry else old.latency
            over = float(entry.get("oversubscription", old.oversubscription))
            out[level] = Link(bandwidth=bw, latency=lat, oversubscription=over)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: links.{level}: {e}") from None
        except ConfigError as e:
            raise ConfigError(f"{where}: links.{level}: {e}") from None
    return Links(**out)


def network_from_mapping(data: Any, source: str) -> Network:
    """The scheduler's topology YAML plus an optional ``links:`` section."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: a cluster file is a mapping (name, device_types, zones, "
                          f"links)")
    rest = {k: v for k, v in data.items() if k != "links"}
    return Network(topology_from_mapping(rest, source), links_from_mapping(data.get("links"),
                                                                          source))


def uniform_network(workers: int, *, gpus_per_server: int = 8, servers_per_rack: int = 32,
                    links: Links | None = None) -> Network:
    """The smallest homogeneous cluster that holds ``workers`` devices: servers of
    ``gpus_per_server`` devices, racks of ``servers_per_rack`` servers, one zone."""
    if workers < 1:
        raise ConfigError(f"--workers: {workers} is not >= 1")
    servers = -(-workers // gpus_per_server)
    racks = -(-servers // servers_per_rack)
    per_rack = min(servers, servers_per_rack)
    topo = uniform(zones=1, racks=racks, servers=per_rack, devices=gpus_per_server,
                   switches=1, name=f"uniform-{racks}x{per_rack}x{gpus_per_server}")
    return Network(topo, links or Links())


def hosts_network(n: int, nic: Link) -> Network:
    """``n`` test hosts, one worker each, behind ``nic`` (the bridge between them: 64x
    faster): the validations' network."""
    return uniform_network(n, gpus_per_server=1,
                           links=Links(nic=nic, rack=Link(bandwidth=nic.bandwidth * 64)))
