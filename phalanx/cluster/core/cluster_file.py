"""A cluster file: the YAML form of a :class:`~phalanx.cluster.core.topology.Topology`, read
with a one-line error naming the file, the entry and the key at fault, and written back.

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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from phalanx.cluster.core.topology import (
    MAX_DEVICES,
    MAX_SERVER_DEVICES,
    DeviceType,
    Topology,
    TopologyBuilder,
)
from phalanx.errors import ConfigError
from phalanx.limits import MAX_SLOW_FACTOR


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
