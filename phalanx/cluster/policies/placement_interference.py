"""``--placement interference``: among the placements that hold a gang, the one whose
co-location costs the least throughput by the pair table (:class:`CoLocation`), the
job's own loss and what it takes from the neighbours it joins, each in GPUs' worth of
rate. Ties (no choice costs over ``tolerance``, 5% of the gang's GPUs, or every choice
costs the same) go to best fit, as ``pack``: the sensitive are isolated where the table
says they suffer, the rest packed so whole servers stay free for gangs.

When the cluster is in demand (``threshold``: busy + queued GPUs over capacity, as
``load-adaptive-demand`` reads it), an empty server is a candidate only when no partly used
one holds the gang: waiting gangs need whole servers more than a job needs quiet
neighbours (without it, FIFO on the Philly trace ran 1.19x pack's mean JCT).

Candidates: on each server that holds the gang, each PCIe switch with room for it (its
free devices), and the server's tightest and loosest spread over switches; when no server
holds it, the fewest servers (tight and loose)."""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.cluster.core.allocator import ClusterState, Placement
from phalanx.cluster.core.jobs import JobSpec
from phalanx.cluster.model.interference import CoLocation, kind_of
from phalanx.cluster.policies.placement import _devices_on_server, _multi_server


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
            cores = ((s, max(g, min(job.cpu_per_gpu * g, cluster.cores_free[s]))),)
            for w in range(srv.first_switch, srv.first_switch + len(srv.switch_sizes)):
                if cluster.switch_free[w] >= g:
                    candidates.append(Placement(
                        tuple(cluster.free_devices_on_switch(w)[:g]), cores))
            for tight in (True, False):
                devs = tuple(_devices_on_server(cluster, s, g, tight))
                candidates.append(Placement(devs, cores))
        if not candidates:
            for tight in (True, False):
                p = _multi_server(cluster, job, tight)
                if p is not None:
                    candidates.append(p)
        if not candidates:
            return None
        if cluster.demand >= self.threshold:
            used = [p for p in candidates if all(
                cluster.server_free[s] < t.server_size[s] for s, _ in p.cores)]
            candidates = used or candidates
        self.co.refresh()     # a live schedule's measurements so far
        owner = _owners(cluster)
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
        mine = {d: None for d in p.devices}
        total = 0.0
        for s in {t.device_server[d] for d in p.devices}:
            my_sw = {t.device_switch[d] for d in mine if t.device_server[d] == s}
            cap = sum(t.switch_size[w] for w in my_sw)
            on_server = _jobs_on_server(cluster, s, owner)
            nbrs = []
            for jid, devs in on_server.items():
                spec = cluster.holders.get(jid)
                b = kind_of(spec.model, spec.kind) if spec is not None else a
                on = sum(1 for d in devs if t.device_switch[d] in my_sw)
                nbrs.append((b, on, len(devs) - on))
                # what a takes from b: b's load with a added, against without
                b_sw = {t.device_switch[d] for d in devs}
                b_cap = sum(t.switch_size[w] for w in b_sw)
                others = [(kind_of(o.model, o.kind) if (o := cluster.holders.get(j)) else a,
                           sum(1 for d in ds if t.device_switch[d] in b_sw),
                           sum(1 for d in ds if t.device_switch[d] not in b_sw))
                          for j, ds in on_server.items() if j != jid]
                before = co.load(b, others, b_cap, t.server_size[s])
                a_on = sum(1 for d in mine if t.device_switch[d] in b_sw)
                a_here = sum(1 for d in mine if t.device_server[d] == s)
                after = before + co.load(b, [(a, a_on, a_here - a_on)], b_cap,
                                         t.server_size[s])
                total += len(devs) * (1.0 / (1.0 + before) - 1.0 / (1.0 + after))
            load = co.load(a, nbrs, cap, t.server_size[s])
            here = sum(1 for d in mine if t.device_server[d] == s)
            total += here * (1.0 - 1.0 / (1.0 + load))
        return total


def _owners(cluster: ClusterState) -> dict[int, int]:
    """Device -> the job holding it."""
    return {d: jid for jid, a in cluster.allocations.items() for d in a.devices}


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
