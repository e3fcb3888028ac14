"""``--placement interference``: among the placements that hold a gang, the one whose
co-location costs the least throughput by the pair table (:class:`CoLocation`), the
job's own loss and what it takes from the neighbours it joins, each in GPUs' worth of
rate. Ties (no choice costs over ``tolerance``, 5% of the gang's GPUs, or every choice
costs the same) go to best fit, as ``pack``: the sensitive are isolated where the table
says they suffer, the rest packed so whole servers stay free for gangs.

When the cluster is in demand (``threshold``: busy + queued GPUs over capacity, as
``load-adaptive-demand`` reads it), an empty server is a candidate only when no partly used
one holds the gang: waiting gangs need whole servers more than a job needs quiet
neighbours (without it, FIFO on the Philly trace ran 1.19x pack's mean JCT:
``--study interference`` at commit dd62092).

Candidates: on each server that holds the gang, each PCIe switch with room for it (its
free devices), and the server's tightest and loosest spread over switches; when no server
holds it, the fewest servers (tight and loose) and, with a ``link`` level in the table,
the fewest servers taken first from those where no other job spans servers (quiet links).

The link level: a gang across servers shares those servers' links with every other job
across servers on one of them (:meth:`CoLocation.link_load`); its cost counts its own
loss and what it takes from each of them, as on a server."""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.cluster.core.allocator import ClusterState, Placement
from phalanx.cluster.core.jobs import JobSpec
from phalanx.cluster.model.interference import CoLocation, kind_of
from phalanx.cluster.policies.placement import (
    _build,
    _greedy,
    _most_free_first,
    _multi_server,
    core_take,
)


@dataclass(frozen=True)
class InterferenceAware:
    co: CoLocation
    # a loss under this share of the gang's GPUs is a tie: not worth a fragmented server
    # (a pair kept 0.98 of its rate is measurement noise more than interference)
    tolerance: float = 0.05
    # demand (busy + queued GPUs over capacity) at which an empty server is broken only
    # when no partly used one holds the gang: gangs waiting need whole servers more than
    # a job needs quiet neighbours (--threshold; load-adaptive-demand's signal)
    threshold: float = 0.5
    name: str = "interference"

    def place(self, job: JobSpec, cluster: ClusterState) -> Placement | None:
        g = job.gpus
        if g > cluster.total_free:
            return None
        t = cluster.topology
        candidates: list[Placement] = []
        empty_seen = set()
        for s in range(len(cluster.server_free)):
            if cluster.server_free[s] < g or cluster.usable_on_server(s) < g:
                continue
            srv = t.servers[s]
            if cluster.server_free[s] == t.server_size[s]:
                # empty servers alike cost nothing: the first of each shape stands for all
                shape = (srv.device_type, srv.switch_sizes, cluster.cores_free[s])
                if shape in empty_seen:
                    continue
                empty_seen.add(shape)
            cores = (core_take(cluster, job, s, g),)
            for w in range(srv.first_switch, srv.first_switch + len(srv.switch_sizes)):
                if cluster.switch_free[w] >= g:
                    candidates.append(Placement(
                        tuple(cluster.free_devices_on_switch(w)[:g]), cores))
            candidates += [_build(cluster, job, [(s, g)], tight) for tight in (True, False)]
        owner = _owners(cluster)
        if not candidates:
            for tight in (True, False):
                p = _multi_server(cluster, job, tight)
                if p is not None:
                    candidates.append(p)
            if candidates and "link" in self.co.levels:
                busy = {s for ss in _across(cluster, owner).values() for s in ss}
                order = (_most_free_first(cluster, (s for s in range(len(t.servers))
                                                    if s not in busy))
                         + _most_free_first(cluster, busy))
                takes = _greedy(cluster, order, g)
                if takes:
                    candidates.append(_build(cluster, job, takes, tight=True))
        if not candidates:
            return None
        if cluster.demand >= self.threshold:
            used = [p for p in candidates if all(
                cluster.server_free[s] < t.server_size[s] for s, _ in p.cores)]
            candidates = used or candidates
        self.co.refresh()     # a live schedule's measurements so far
        best, best_key = None, None
        for p in candidates:
            devs = set(p.devices)
            # best fit after the cost: the fullest servers, then the fullest switches
            fit = (sum(cluster.usable_on_server(s) for s, _ in p.cores),
                   sum(cluster.switch_free[t.device_switch[d]] for d in devs))
            cost = self.cost(job, p, cluster, owner)
            key = (0.0 if cost <= self.tolerance * g else round(cost, 9), fit, sorted(devs))
            if best_key is None or key < best_key:
                best, best_key = p, key
        return best

    def cost(self, job: JobSpec, p: Placement, cluster: ClusterState,
             owner: dict[int, int] | None = None) -> float:
        """GPUs' worth of rate lost to co-location if ``job`` takes ``p``: its own loss
        beside its neighbours plus what it takes from each of them."""
        t, co = cluster.topology, self.co
        owner = _owners(cluster) if owner is None else owner
        a = kind_of(job.model, job.kind)

        def split(devs: list[int], switches: set[int]) -> tuple[int, int]:
            """(devices on ``switches``, devices elsewhere) of ``devs``."""
            on = sum(1 for d in devs if t.device_switch[d] in switches)
            return on, len(devs) - on

        total = 0.0
        for s in {t.device_server[d] for d in p.devices}:
            size = t.server_size[s]
            mine = [d for d in p.devices if t.device_server[d] == s]
            my_sw = {t.device_switch[d] for d in mine}
            on_server = _jobs_on_server(cluster, s, owner)
            kinds = {j: kind_of(o.model, o.kind) if (o := cluster.holders.get(j)) else a
                     for j in on_server}
            for jid, devs in on_server.items():
                # what a takes from b: b's load with a added, against without
                b_sw = {t.device_switch[d] for d in devs}
                b_cap = sum(t.switch_size[w] for w in b_sw)
                before = co.load(kinds[jid], [(kinds[j], *split(ds, b_sw)) for j, ds
                                              in on_server.items() if j != jid], b_cap, size)
                after = before + co.load(kinds[jid], [(a, *split(mine, b_sw))], b_cap, size)
                total += len(devs) * (1.0 / (1.0 + before) - 1.0 / (1.0 + after))
            load = co.load(a, [(kinds[j], *split(ds, my_sw)) for j, ds in on_server.items()],
                           sum(t.switch_size[w] for w in my_sw), size)
            total += len(mine) * (1.0 - 1.0 / (1.0 + load))
        servers = {t.device_server[d] for d in p.devices}
        if len(servers) > 1 and "link" in co.levels:
            total += self._link_cost(a, len(p.devices), servers, cluster, owner)
        return total

    def _link_cost(self, a: str, g: int, servers: set[int], cluster: ClusterState,
                   owner: dict[int, int]) -> float:
        """The link level's part of :meth:`cost`: a gang across ``servers`` shares their
        links with each job across servers on one of them."""
        co = self.co
        across = _across(cluster, owner)
        kind = {j: kind_of(o.model, o.kind) if (o := cluster.holders.get(j)) else a
                for j in across}
        sharing = [j for j, ss in across.items() if ss & servers]
        total = g * (1.0 - 1.0 / (1.0 + co.link_load(a, [kind[j] for j in sharing])))
        for j in sharing:
            before = co.link_load(kind[j], [kind[k] for k, ss in across.items()
                                            if k != j and ss & across[j]])
            after = before + co.link_load(kind[j], [a])
            devs = sum(1 for jid in owner.values() if jid == j)
            total += devs * (1.0 / (1.0 + before) - 1.0 / (1.0 + after))
        return total


def _owners(cluster: ClusterState) -> dict[int, int]:
    """Device -> the job holding it."""
    return {d: jid for jid, a in cluster.allocations.items() for d in a.devices}


def _across(cluster: ClusterState, owner: dict[int, int]) -> dict[int, set[int]]:
    """Each job that spans servers -> its servers (it sends over their links)."""
    t = cluster.topology
    servers: dict[int, set[int]] = {}
    for d, jid in owner.items():
        servers.setdefault(jid, set()).add(t.device_server[d])
    return {j: ss for j, ss in servers.items() if len(ss) > 1}


def _jobs_on_server(cluster: ClusterState, s: int, owner: dict[int, int]
                    ) -> dict[int, list[int]]:
    t = cluster.topology
    out: dict[int, list[int]] = {}
    first = t.servers[s].first_device
    for d in range(first, first + t.servers[s].num_devices):
        jid = owner.get(d)
        if jid is not None:
            out.setdefault(jid, []).append(d)
    return out
