"""Cluster topology: the resource manager's "configuration set".

A cluster is zones (InfiniBand domains) > racks > servers > devices. Inside a server the
devices hang off PCIe switches (or straight off the CPU root complex, modelled as one
group). Every level gets a dense integer id so the allocator can keep bitmaps and free
counts in flat lists: devices of one server are contiguous, servers of one rack are
contiguous, racks of one zone are contiguous.

Read from and written to a YAML cluster file by ``cluster_file.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from phalanx.errors import ConfigError

MAX_DEVICES = 1 << 17  # devices in one cluster (file; the largest we use: ~6,000)
MAX_SERVER_DEVICES = 1024


@dataclass(frozen=True)
class DeviceType:
    """A GPU model: its name, its speed relative to the reference device, its memory, and
    the slowdown that emulates it on a CPU machine (the live scheduler's ranks on it
    compute ``slowdown`` times slower, ``--slow-workers``' straggler emulation; 1: none)."""

    name: str
    speed: float = 1.0          # throughput relative to the reference device (v100 = 1.0)
    memory_gib: float = 16.0
    slowdown: float = 1.0


@dataclass(frozen=True)
class Server:
    """One server: its devices (dense ids), PCIe switches, CPU cores, memory and device
    type."""

    name: str
    index: int
    rack: int
    zone: int
    device_type: str
    first_device: int
    num_devices: int
    first_switch: int
    switch_sizes: tuple[int, ...]   # devices behind each PCIe switch, in device order
    cpu_cores: int
    memory_gib: float

    @property
    def devices(self) -> range:
        return range(self.first_device, self.first_device + self.num_devices)


@dataclass(frozen=True)
class Rack:
    """The servers of one rack."""

    name: str
    index: int
    zone: int
    servers: range


@dataclass(frozen=True)
class Zone:
    """The racks of one zone (an InfiniBand domain)."""

    name: str
    index: int
    racks: range


class Topology:
    """Immutable description of a cluster plus flat lookup tables (device -> server ...)."""

    def __init__(self, name: str, device_types: Sequence[DeviceType], zones: Sequence[Zone],
                 racks: Sequence[Rack], servers: Sequence[Server]) -> None:
        self.name = name
        self.device_types = {t.name: t for t in device_types}
        self.zones, self.racks, self.servers = tuple(zones), tuple(racks), tuple(servers)
        self.num_devices = sum(s.num_devices for s in servers)
        self.num_switches = sum(len(s.switch_sizes) for s in servers)
        # flat tables: the allocator and the placement policies index these in hot loops
        self.device_server: list[int] = []
        self.device_switch: list[int] = []
        self.switch_server: list[int] = []
        self.switch_size: list[int] = []
        for s in servers:
            for k, size in enumerate(s.switch_sizes):
                self.switch_server.append(s.index)
                self.switch_size.append(size)
                self.device_server.extend([s.index] * size)
                self.device_switch.extend([s.first_switch + k] * size)
        self.server_rack = [s.rack for s in servers]
        self.rack_zone = [r.zone for r in racks]
        self.server_size = [s.num_devices for s in servers]
        self.rack_size = [sum(servers[i].num_devices for i in r.servers) for r in racks]
        self.zone_size = [sum(self.rack_size[i] for i in z.racks) for z in zones]
        self.max_server_devices = max(self.server_size)

    def __repr__(self) -> str:
        return (f"Topology({self.name!r}: {len(self.zones)} zones, {len(self.racks)} racks, "
                f"{len(self.servers)} servers, {self.num_devices} devices)")

    def device_speed(self, device: int) -> float:
        return self.device_types[self.servers[self.device_server[device]].device_type].speed

    def device_type_of(self, device: int) -> str:
        return self.servers[self.device_server[device]].device_type

    def gang_type(self, devices: Sequence[int]) -> str:
        """The one device type of a gang; a gang across types is refused with the reason
        (a job runs on one type at a time: one type's speed and, emulated, one slowdown)."""
        types = sorted({self.device_type_of(d) for d in devices})
        if len(types) > 1:
            raise ConfigError(f"a gang across device types {', '.join(types)} is refused: a "
                              f"job runs on one type at a time (its speed and its emulated "
                              f"slowdown are one type's)")
        return types[0] if types else ""

    @property
    def emulated(self) -> bool:
        """A type of its servers declares a slowdown: the live scheduler emulates it."""
        return any(self.device_types[s.device_type].slowdown > 1 for s in self.servers)

    @property
    def typed(self) -> bool:
        """Several device types among the servers (a job then runs on one of them)."""
        return len({s.device_type for s in self.servers}) > 1

    def to_mapping(self) -> dict[str, Any]:
        """The YAML configuration set of this topology (one entry per server, no repeats)."""
        return {
            "name": self.name,
            "device_types": [{"name": t.name, "speed": t.speed, "memory_gib": t.memory_gib,
                              **({"slowdown": t.slowdown} if t.slowdown != 1 else {})}
                             for t in self.device_types.values()],
            "zones": [{"name": z.name, "racks": [
                {"name": self.racks[r].name, "servers": [
                    {"name": self.servers[s].name, "device_type": self.servers[s].device_type,
                     "devices": self.servers[s].num_devices,
                     "pcie_switches": list(self.servers[s].switch_sizes),
                     "cpu_cores": self.servers[s].cpu_cores,
                     "memory_gib": self.servers[s].memory_gib}
                    for s in self.racks[r].servers]} for r in z.racks]} for z in self.zones],
        }


# ----------------------------------------------------------------------------- building

class TopologyBuilder:
    """Appends zones/racks/servers in order and assigns the dense ids."""

    def __init__(self, name: str, device_types: Sequence[DeviceType]) -> None:
        self.name, self.device_types = name, list(device_types)
        self.zones: list[Zone] = []
        self.racks: list[Rack] = []
        self.servers: list[Server] = []
        self._devices = self._switches = 0
        self._zone_rack_start = self._rack_server_start = 0

    def begin_zone(self) -> None:
        self._zone_rack_start = len(self.racks)

    def end_zone(self, name: str) -> None:
        self.zones.append(Zone(name, len(self.zones), range(self._zone_rack_start,
                                                            len(self.racks))))

    def begin_rack(self) -> None:
        self._rack_server_start = len(self.servers)

    def end_rack(self, name: str) -> None:
        self.racks.append(Rack(name, len(self.racks), len(self.zones),
                               range(self._rack_server_start, len(self.servers))))

    def add_server(self, name: str, device_type: str, switch_sizes: Sequence[int],
                   cpu_cores: int, memory_gib: float) -> None:
        n = sum(switch_sizes)
        self.servers.append(Server(name, len(self.servers), len(self.racks), len(self.zones),
                                   device_type, self._devices, n, self._switches,
                                   tuple(switch_sizes), cpu_cores, memory_gib))
        self._devices += n
        self._switches += len(switch_sizes)

    def build(self) -> Topology:
        if not self.servers:
            raise ConfigError(f"cluster {self.name!r}: no servers")
        return Topology(self.name, self.device_types, self.zones, self.racks, self.servers)


def uniform(zones: int = 1, racks: int = 1, servers: int = 4, devices: int = 8,
            switches: int = 2, device_type: str = "v100", cpu_cores: int = 32,
            memory_gib: float = 256.0, name: str | None = None) -> Topology:
    """A homogeneous cluster: zones x racks x servers, each with ``devices`` split evenly
    over ``switches`` PCIe switches."""
    for label, v in (("zones", zones), ("racks", racks), ("servers", servers),
                     ("devices", devices), ("switches", switches), ("cpu_cores", cpu_cores)):
        if not isinstance(v, int) or v < 1:
            raise ConfigError(f"uniform cluster: {label} must be a positive integer, got {v!r}")
    total = zones * racks * servers * devices
    if devices > MAX_SERVER_DEVICES or total > MAX_DEVICES:
        raise ConfigError(f"uniform cluster: {zones}x{racks}x{servers}x{devices} is {total:,} "
                          f"devices (at most {MAX_SERVER_DEVICES} per server and "
                          f"{MAX_DEVICES:,} in all)")
    if devices % switches:
        raise ConfigError(f"uniform cluster: {devices} devices do not split evenly over "
                          f"{switches} PCIe switches")
    speed = {"v100": 1.0, "p100": 0.62, "k80": 0.27}.get(device_type, 1.0)
    b = TopologyBuilder(name or f"uniform-{zones}x{racks}x{servers}x{devices}",
                        [DeviceType(device_type, speed)])
    for z in range(zones):
        b.begin_zone()
        for r in range(racks):
            b.begin_rack()
            for s in range(servers):
                b.add_server(f"z{z}-r{r}-s{s}", device_type, [devices // switches] * switches,
                             cpu_cores, memory_gib)
            b.end_rack(f"z{z}-r{r}")
        b.end_zone(f"z{z}")
    return b.build()
