"""The cluster a schedule ran on, as the page draws it: zones > racks > servers > devices,
each server with its GPU type. Where it comes from, first found wins:

1. ``topology.yaml`` in the schedule's folder (``phalanx schedule --dashboard`` writes it);
2. the cluster named in its ``summary.json`` (``philly-2048``, ``pollux-64``,
   ``uniform-ZxRxSxG`` as the simulator names it);
3. a live state's server list (``name:devices``, one zone, one rack);
4. the devices its placements name (one server), so a map is always drawn."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from phalanx.cluster.core.cluster_file import load_topology
from phalanx.cluster.core.clusters import NAMED
from phalanx.cluster.core.topology import Topology, uniform

TOPOLOGY_FILE = "topology.yaml"
_UNIFORM = re.compile(r"uniform-(\d+)x(\d+)x(\d+)x(\d+)")
MAX_NAMED_DEVICES = 100_000


def to_json(t: Topology) -> dict[str, Any]:
    zones = []
    for z in t.zones:
        racks = []
        for r in (t.racks[i] for i in z.racks):
            racks.append({"name": r.name, "servers": [
                {"name": s.name, "type": s.device_type, "first": s.first_device,
                 "n": s.num_devices} for s in (t.servers[i] for i in r.servers)]})
        zones.append({"name": z.name, "racks": racks})
    return {"name": t.name, "devices": t.num_devices, "zones": zones, "source": ""}


def _flat(name: str, servers: list[tuple[str, int]], source: str) -> dict[str, Any]:
    out, first = [], 0
    for sname, n in servers:
        out.append({"name": sname, "type": "?", "first": first, "n": n})
        first += n
    return {"name": name, "devices": first, "source": source,
            "zones": [{"name": "zone", "racks": [{"name": "rack", "servers": out}]}]}


def _named(name: str) -> Topology | None:
    if name in NAMED:
        return NAMED[name]()
    m = _UNIFORM.fullmatch(name)
    if m:
        z, r, s, g = (int(x) for x in m.groups())
        if z * r * s * g <= MAX_NAMED_DEVICES:
            return uniform(z, r, s, g)
    return None


def cluster_map(folder: Path, cluster_name: str, state_servers: list[str],
                max_device: int, problems: list[str]) -> dict[str, Any]:
    path = folder / TOPOLOGY_FILE
    if path.is_file():
        try:
            out = to_json(load_topology(path))
            out["source"] = TOPOLOGY_FILE
            return out
        except Exception as e:  # noqa: BLE001 - any bad file is shown, never raised
            problems.append(f"{TOPOLOGY_FILE}: {str(e).splitlines()[0][:200]}")
    try:
        t = _named(cluster_name) if cluster_name else None
    except Exception:  # noqa: BLE001
        t = None
    if t is not None:
        out = to_json(t)
        out["source"] = f"the cluster {cluster_name}"
        return out
    servers = []
    for entry in state_servers:
        name, _, n = entry.rpartition(":")
        if name and n.isdigit():
            servers.append((name, int(n)))
    if servers:
        return _flat(cluster_name or "cluster", servers, "the state's server list")
    return _flat(cluster_name or "cluster", [("devices", max_device + 1)],
                 "the devices its placements name")
