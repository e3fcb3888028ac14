"""Who runs beside whom in a cluster's allocations, and each running job's load from them
by a pair table (:class:`CoLocation`): the interval engine's interference (the event
engine keeps its own index of the same, re-rated per event).

A job's load is its worst server's (``CoLocation.load``: neighbours on its PCIe switches
at level ``core``, elsewhere on the server at ``server``) plus, for a job that spans
servers, ``CoLocation.link_load`` from the other jobs that span servers and share one of
its servers (their ranks send over the same servers' links); its rate is ``1 / (1 +
load)`` of its rate alone.
"""

from __future__ import annotations

from collections.abc import Mapping

from phalanx.cluster.core.allocator import ClusterState
from phalanx.cluster.model.interference import CoLocation


def jobs_on_servers(cluster: ClusterState) -> dict[int, dict[int, list[int]]]:
    """Server -> job -> the job's devices there (servers with a job only)."""
    t = cluster.topology
    out: dict[int, dict[int, list[int]]] = {}
    for jid, alloc in cluster.allocations.items():
        for d in alloc.devices:
            out.setdefault(t.device_server[d], {}).setdefault(jid, []).append(d)
    return out


def across_neighbours(jid: int, on_server: Mapping[int, Mapping[int, list[int]]]
                      ) -> list[int]:
    """The other jobs that span servers and share a server with ``jid`` (which spans
    servers; else none): they share its servers' links."""
    servers_of: dict[int, set[int]] = {}
    for s, jobs in on_server.items():
        for j in jobs:
            servers_of.setdefault(j, set()).add(s)
    mine = servers_of.get(jid, set())
    if len(mine) < 2:
        return []
    return sorted(j for j, ss in servers_of.items()
                  if j != jid and len(ss) > 1 and ss & mine)


def pair_loads(cluster: ClusterState, kinds: Mapping[int, str], co: CoLocation
               ) -> dict[int, float]:
    """Each job of ``kinds`` (job -> its class; every job holding devices must be there)
    : its load from its neighbours (see the module doc)."""
    t = cluster.topology
    on_server = jobs_on_servers(cluster)
    out = {}
    for jid, a in kinds.items():
        worst = 0.0
        for s, jobs in on_server.items():
            mine = jobs.get(jid)
            if mine is None:
                continue
            my_sw = {t.device_switch[d] for d in mine}
            neighbours = []
            for other, devs in jobs.items():
                if other != jid:
                    on = sum(1 for d in devs if t.device_switch[d] in my_sw)
                    neighbours.append((kinds[other], on, len(devs) - on))
            worst = max(worst, co.load(a, neighbours, sum(t.switch_size[w] for w in my_sw),
                                       t.server_size[s]))
        out[jid] = worst + co.link_load(a, [kinds[j] for j in across_neighbours(jid,
                                                                                on_server)])
    return out
