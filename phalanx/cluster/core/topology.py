"""Cluster topology: the resource manager's "configuration set".

A cluster is zones (InfiniBand domains) > racks > servers > devices. Inside a server the
devices hang off PCIe switches (or straight off the CPU root complex, modelled as one
group). Every level gets a dense integer id so the allocator can keep bitmaps and free
counts in flat lists: devices of one server are contiguous, servers of one rack are
contiguous, racks of one zone are contiguous.

The YAML form (see docs/cluster.md)::

    name: demo
    device_types:
      - {name: v100, speed: 1.0, memory_gib: 32}
      - {name: slow, speed: 0.33, slowdown: 3}   # emulated on CPU: 3x slower compute
    zones:
      - name: ib0
        racks:
          - name: r
            repeat: 2            # optional: copies named r0, r1
            servers:
              - {name: s, repeat: 4, device_type: v100, devices: 8,
                 pcie_switches: [4, 4], cpu_cores: 32, memory_gib: 256}
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from phalanx.errors import ConfigError
from phalanx.limits import MAX_SLOW_FACTOR


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


# ----------------------------------------------------------------------------- YAML

def _field(obj: Mapping[str, Any], key: str, where: str, kind: type, default: Any = None,
           positive: bool = False) -> Any:
    if key not in obj:
        if default is None:
            raise ConfigError(f"{where}: missing '{key}'")
        return default
    v = obj[key]
    accepted = (int, float) if kind is float else kind
    ok = isinstance(v, accepted) and not isinstance(v, bool)
    if not ok:
        raise ConfigError(f"{where}.{key}: expected {kind.__name__}, got {v!r}")
    if positive and not (v > 0 and math.isfinite(v)):   # NaN and inf too (YAML .nan/.inf)
        raise ConfigError(f"{where}.{key}: must be a finite number > 0, got {v!r}")
    return v


def _check_keys(obj: Any, allowed: set[str], where: str) -> None:
    if not isinstance(obj, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(obj).__name__}")
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(map(str, unknown))} "
                          f"(allowed: {', '.join(sorted(allowed))})")


def _list(obj: Mapping[str, Any], key: str, where: str) -> list[Any]:
    v = obj.get(key)
    if not isinstance(v, list) or not v:
        raise ConfigError(f"{where}.{key}: expected a non-empty list")
    return v


MAX_DEVICES = 1 << 17  # devices in one cluster file (the largest we use: ~6,000)
MAX_SERVER_DEVICES = 1024


def _bounded(v: int, where: str, key: str, high: int = MAX_DEVICES) -> int:
    if v > high:
        raise ConfigError(f"{where}.{key}: {v} is more than {high}")
    return v


def _device_types(data: Any, source: str) -> list[DeviceType]:
    types: list[DeviceType] = []
    for i, t in enumerate(_list(data, "device_types", source)):
        where = f"{source}: device_types[{i}]"
        _check_keys(t, {"name", "speed", "memory_gib", "slowdown"}, where)
        slow = float(_field(t, "slowdown", where, float, 1.0))
        if not 1.0 <= slow <= MAX_SLOW_FACTOR:      # NaN fails both
            raise ConfigError(f"{where}.slowdown: must be a finite number in "
                              f"1..{MAX_SLOW_FACTOR:g}, got {t['slowdown']!r}")
        types.append(DeviceType(str(_field(t, "name", where, str)),
                                float(_field(t, "speed", where, float, 1.0, positive=True)),
                                float(_field(t, "memory_gib", where, float, 16.0, positive=True)),
                                slow))
    if len({t.name for t in types}) != len(types):
        raise ConfigError(f"{source}: device_types: duplicate names")
    return types


@dataclass(frozen=True)
class _ServerEntry:
    """One ``servers`` entry of a rack, checked."""

    name: str
    device_type: str
    devices: int
    switches: list[int]
    cores: int
    memory_gib: float
    repeat: int


def _server_entry(s: Any, sw: str, type_names: set[str]) -> _ServerEntry:
    _check_keys(s, {"name", "repeat", "device_type", "devices", "pcie_switches",
                    "cpu_cores", "memory_gib"}, sw)
    dtype = _field(s, "device_type", sw, str)
    if dtype not in type_names:
        raise ConfigError(f"{sw}.device_type: {dtype!r} is not one of "
                          f"device_types ({', '.join(sorted(type_names))})")
    n = _bounded(_field(s, "devices", sw, int, positive=True), sw, "devices", MAX_SERVER_DEVICES)
    switches = s.get("pcie_switches", [n])
    if (not isinstance(switches, list) or not switches
            or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                       for x in switches)):
        raise ConfigError(f"{sw}.pcie_switches: expected a list of positive "
                          f"device counts, got {switches!r}")
    if sum(switches) != n:
        raise ConfigError(f"{sw}.pcie_switches: {switches} holds {sum(switches)} "
                          f"devices but devices is {n}")
    cores = _field(s, "cpu_cores", sw, int, positive=True)
    mem = float(_field(s, "memory_gib", sw, float, 64.0, positive=True))
    srep = _bounded(_field(s, "repeat", sw, int, 1, positive=True), sw, "repeat")
    return _ServerEntry(str(_field(s, "name", sw, str)), dtype, n, switches, cores, mem, srep)


def topology_from_mapping(data: Any, source: str = "cluster") -> Topology:
    """Validate a configuration set and build the topology; errors name the exact entry."""
    _check_keys(data, {"name", "device_types", "zones"}, source)
    name = str(data.get("name", Path(source).stem))
    types = _device_types(data, source)
    type_names = {t.name for t in types}
    b = TopologyBuilder(name, types)
    seen: set[str] = set()

    def unique(n: str, where: str) -> str:
        if n in seen:
            raise ConfigError(f"{where}: duplicate name {n!r}")
        seen.add(n)
        return n

    racks: set[str] = set()
    total_devices = 0
    for zi, z in enumerate(_list(data, "zones", source)):
        zw = f"{source}: zones[{zi}]"
        _check_keys(z, {"name", "racks"}, zw)
        b.begin_zone()
        for ri, r in enumerate(_list(z, "racks", zw)):
            rw = f"{zw}.racks[{ri}]"
            _check_keys(r, {"name", "repeat", "servers"}, rw)
            rrep = _bounded(_field(r, "repeat", rw, int, 1, positive=True), rw, "repeat")
            for rk in range(rrep):
                b.begin_rack()
                for si, s in enumerate(_list(r, "servers", rw)):
                    sw = f"{rw}.servers[{si}]"
                    e = _server_entry(s, sw, type_names)
                    total_devices += rrep * e.repeat * e.devices if rk == 0 else 0
                    if total_devices > MAX_DEVICES:
                        raise ConfigError(f"{sw}: the cluster would hold more than "
                                          f"{MAX_DEVICES} devices")
                    for k in range(e.repeat):
                        sname = e.name if e.repeat == 1 else f"{e.name}{k}"
                        if rrep > 1:
                            sname = f"{r.get('name', 'rack')}{rk}-{sname}"
                        b.add_server(unique(sname, sw), e.device_type, e.switches, e.cores,
                                     e.memory_gib)
                rname = str(r.get("name", f"rack{ri}"))
                rname = rname if rrep == 1 else f"{rname}{rk}"
                if rname in racks:
                    raise ConfigError(f"{rw}: duplicate rack name {rname!r}")
                racks.add(rname)
                b.end_rack(rname)
        b.end_zone(unique(str(z.get("name", f"zone{zi}")), zw))
    return b.build()


def load_topology(path: str | Path) -> Topology:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cluster file {p}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"cluster file {p}: not UTF-8 text (byte {e.start})") from None
    return topology_from_mapping(read_yaml(text, f"cluster file {p}", ConfigError),
                                 source=str(p))


def read_yaml(text: str, what: str, error: type[Exception]) -> object:
    """``text`` as YAML; ``error`` (one line naming ``what``) for a syntax error (with its
    line) or nesting too deep to read (100,000 brackets: a RecursionError)."""
    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise error(f"{what}: nested too deeply to read") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise error(f"{what}: invalid YAML{at}") from None


def save_topology(topology: Topology, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(topology.to_mapping(), sort_keys=False))
