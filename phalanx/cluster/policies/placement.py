"""Placement policies: which devices a gang gets. ``place`` returns a ``Placement`` (all
devices of the gang, or ``None`` when it does not fit now) and only reads the cluster.

Every device needs at least one CPU core; a job asks for ``cpu_per_gpu`` cores per GPU
and gets what the server has left (the perf model charges a short share).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from phalanx.cluster.core.allocator import ClusterState, Placement
from phalanx.cluster.core.jobs import JobSpec
from phalanx.errors import ConfigError


class PlacementPolicy(Protocol):
    """Finds devices for a gang on the ``ClusterState`` (None: it does not fit now); never
    mutates it."""

    name: str

    def place(self, job: JobSpec, cluster: ClusterState) -> Placement | None: ...


# ------------------------------------------------------------------ shared helpers

def _devices_on_server(cluster: ClusterState, s: int, k: int, tight: bool) -> list[int]:
    """``k`` free devices of server ``s``: inside one PCIe switch when one has room (the
    fullest such switch if ``tight``, the emptiest otherwise), else the fewest switches."""
    srv = cluster.topology.servers[s]
    n_sw = len(srv.switch_sizes)
    if n_sw == 1:
        return cluster.free_devices(s)[:k]
    free = cluster.switch_free
    switches = range(srv.first_switch, srv.first_switch + n_sw)
    fits = [w for w in switches if free[w] >= k]
    if fits:
        w = (min(fits, key=lambda w: (free[w], w)) if tight
             else max(fits, key=lambda w: (free[w], -w)))
        return cluster.free_devices_on_switch(w)[:k]
    out: list[int] = []
    for w in sorted(switches, key=lambda w: (-free[w], w)):
        out.extend(cluster.free_devices_on_switch(w)[:k - len(out)])
        if len(out) == k:
            break
    return out


def core_take(cluster: ClusterState, job: JobSpec, s: int, k: int) -> tuple[int, int]:
    """(server, cores) for ``k`` of the gang's GPUs on server ``s``: what the job asks
    (``cpu_per_gpu`` each), at most what the server has left, at least one per GPU."""
    return s, max(k, min(job.cpu_per_gpu * k, cluster.cores_free[s]))


def _build(cluster: ClusterState, job: JobSpec, takes: Iterable[tuple[int, int]],
           tight: bool) -> Placement:
    devices: list[int] = []
    cores = []
    for s, k in takes:
        devices.extend(_devices_on_server(cluster, s, k, tight))
        cores.append(core_take(cluster, job, s, k))
    return Placement(tuple(devices), tuple(cores))


def place_on(cluster: ClusterState, job: JobSpec, takes: Iterable[tuple[int, int]]
             ) -> Placement | None:
    """``k`` GPUs on each server ``s`` of ``takes`` (a policy that names its servers, as
    Pollux does), or None if one of them has not that many free."""
    takes = list(takes)
    if any(cluster.usable_on_server(s) < k for s, k in takes):
        return None
    return _build(cluster, job, sorted(takes), tight=True)


def place_typed(cluster: ClusterState, spec: JobSpec, gpus: int, device_type: str
                ) -> Placement | None:
    """``gpus`` GPUs on servers of ``device_type`` only: the fullest server that holds
    them all, else whole servers, most free first (a gang never spans types)."""
    topo = cluster.topology
    servers = [s.index for s in topo.servers if s.device_type == device_type]
    free = {s: cluster.usable_on_server(s) for s in servers}
    fits = [s for s in servers if free[s] >= gpus]
    if fits:
        s = min(fits, key=lambda s: (free[s], s))
        return place_on(cluster, spec, [(s, gpus)])
    takes, need = [], gpus
    for s in sorted(servers, key=lambda s: (-free[s], s)):
        if free[s] and need:
            k = min(need, free[s])
            takes.append((s, k))
            need -= k
    return place_on(cluster, spec, takes) if not need else None


@dataclass(frozen=True)
class OneType:
    """A placement on a cluster of several device types: a gang runs on one type at a
    time (one type's speed; one profile prices it), so ``inner``'s placement is taken when
    it lies on one type, else the first type of ``order`` (fastest first) that holds the
    gang, placed there by :func:`place_typed`."""

    inner: PlacementPolicy
    order: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.inner.name

    def place(self, job: JobSpec, cluster: ClusterState) -> Placement | None:
        topo = cluster.topology
        p = self.inner.place(job, cluster)
        if p is not None and len({topo.device_type_of(d) for d in p.devices}) == 1:
            return p
        for t in self.order:
            q = place_typed(cluster, job, job.gpus, t)
            if q is not None:
                return q
        return None


def _greedy(cluster: ClusterState, servers: Iterable[int], gpus: int) -> list[tuple[int, int]]:
    """Take devices from ``servers`` in the given order until the gang is complete."""
    takes, need = [], gpus
    for s in servers:
        u = cluster.usable_on_server(s)
        if u:
            k = min(need, u)
            takes.append((s, k))
            need -= k
            if not need:
                return takes
    return []


def _most_free_first(cluster: ClusterState, servers: Iterable[int]) -> list[int]:
    return sorted(servers, key=lambda s: (-cluster.usable_on_server(s), s))


def _best_fit_server(cluster: ClusterState, gpus: int, emptiest: bool) -> int:
    """Server with the fewest (or most, if ``emptiest``) usable devices that still holds
    the gang, -1 if none does."""
    best, best_u = -1, -1
    usable = cluster.usable_on_server
    for s in range(len(cluster.server_free)):
        if cluster.server_free[s] < gpus:
            continue
        u = usable(s)
        if u < gpus:
            continue
        if best < 0 or (u > best_u if emptiest else u < best_u):
            best, best_u = s, u
    return best


def _multi_server(cluster: ClusterState, job: JobSpec, tight: bool) -> Placement | None:
    takes = _greedy(cluster, _most_free_first(cluster, range(len(cluster.server_free))),
                    job.gpus)
    return _build(cluster, job, takes, tight) if takes else None


# ------------------------------------------------------------------ policies

@dataclass(frozen=True)
class FirstFit:
    """The first server (in index order) that holds the whole gang; else servers in index
    order."""

    name: str = "first-fit"

    def place(self, job: JobSpec, cluster: ClusterState) -> Placement | None:
        if job.gpus > cluster.total_free:
            return None
        for s in range(len(cluster.server_free)):
            if cluster.server_free[s] >= job.gpus and cluster.usable_on_server(s) >= job.gpus:
                return _build(cluster, job, [(s, job.gpus)], tight=True)
        takes = _greedy(cluster, range(len(cluster.server_free)), job.gpus)
        return _build(cluster, job, takes, tight=True) if takes else None


@dataclass(frozen=True)
class Pack:
    """Consolidate: the fullest server that still holds the gang (best fit), else the
    fewest servers. Keeps whole servers free for big gangs."""

    name: str = "pack"

    def place(self, job: JobSpec, cluster: ClusterState) -> Placement | None:
        if job.gpus > cluster.total_free:
            return None
        s = _best_fit_server(cluster, job.gpus, emptiest=False)
        if s >= 0:
            return _build(cluster, job, [(s, job.gpus)], tight=True)
        return _multi_server(cluster, job, tight=True)


@dataclass(frozen=True)
class Spread:
    """Spread jobs: the emptiest server that holds the gang (least PCIe interference), and
    inside it the emptiest PCIe switch; else the fewest servers."""

    name: str = "spread"

    def place(self, job: JobSpec, cluster: ClusterState) -> Placement | None:
        if job.gpus > cluster.total_free:
            return None
        s = _best_fit_server(cluster, job.gpus, emptiest=True)
        if s >= 0:
            return _build(cluster, job, [(s, job.gpus)], tight=False)
        return _multi_server(cluster, job, tight=False)


@dataclass(frozen=True)
class SpreadKeepEmpty:
    """Spread for interference without fragmenting: among *partly used* servers that hold
    the gang, the one where the gang lands on the emptiest PCIe switch (then the emptiest
    server); a wholly free server is broken only when no partly used one has room, so whole
    servers stay available for big gangs. Else the fewest servers, like ``Spread``."""

    name: str = "spread-keep-empty"

    def place(self, job: JobSpec, cluster: ClusterState) -> Placement | None:
        g = job.gpus
        if g > cluster.total_free:
            return None
        t = cluster.topology
        sw_free, srv_free = cluster.switch_free, cluster.server_free
        best, best_key = -1, (-1.0, -1)
        for s in range(len(srv_free)):
            f = srv_free[s]
            if f < g or f == t.server_size[s] or cluster.usable_on_server(s) < g:
                continue   # too small, or wholly free (kept for gangs)
            first = t.servers[s].first_switch
            # share of the switch left free after the gang lands on the emptiest one that
            # holds it (0 when the gang must span switches): higher = less interference
            room = max(((sw_free[w] - g) / t.switch_size[w]
                        for w in range(first, first + len(t.servers[s].switch_sizes))
                        if sw_free[w] >= g), default=0.0)
            key = (room, f)
            if key > best_key:
                best, best_key = s, key
        if best >= 0:
            return _build(cluster, job, [(best, g)], tight=False)
        return Spread().place(job, cluster)


@dataclass(frozen=True)
class LoadAdaptive:
    """The seeds' rule: spread while the cluster is idle, pack when it is busy to leave
    room for big gang jobs.

    ``signal`` is what "busy" means: ``utilisation`` (devices in use now, the seeds'
    reading) or ``demand`` (devices in use + the gang being placed + GPUs asked by
    everything waiting: queue pressure, known before the queue hits the wall). With
    ``hysteresis`` > 0 the policy stays in pack mode until the signal falls below
    ``threshold - hysteresis``, so a short dip inside a burst does not hand out spread
    placements that outlive it. That mode is the one piece of state a placement policy
    keeps: build a fresh object per run (``make_placement`` does).
    """

    threshold: float = 0.5
    idle: PlacementPolicy = field(default_factory=Spread)
    busy: PlacementPolicy = field(default_factory=Pack)
    signal: str = "utilisation"
    hysteresis: float = 0.0
    name: str = "load-adaptive"
    _packing: list[bool] = field(default_factory=lambda: [False], compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ConfigError(f"load-adaptive threshold must be in [0, 1], got {self.threshold}")
        if self.signal not in LOAD_SIGNALS:
            raise ConfigError(f"load-adaptive signal {self.signal!r}: choose from "
                              f"{', '.join(LOAD_SIGNALS)}")
        if not 0.0 <= self.hysteresis <= self.threshold:
            raise ConfigError(f"load-adaptive hysteresis must be in [0, threshold], "
                              f"got {self.hysteresis}")

    def load(self, job: JobSpec, cluster: ClusterState) -> float:
        if self.signal == "demand":
            # the job is itself in the queue while it is being placed: queued_gpus counts it
            # (a caller that placed it without queueing gets it added here)
            queued = max(cluster.queued_gpus, job.gpus)
            return (cluster.busy + queued) / cluster.capacity
        return cluster.utilisation

    def place(self, job: JobSpec, cluster: ClusterState) -> Placement | None:
        x = self.load(job, cluster)
        if x >= self.threshold:
            self._packing[0] = True
        elif x < self.threshold - self.hysteresis:
            self._packing[0] = False
        return (self.busy if self._packing[0] else self.idle).place(job, cluster)


LOAD_SIGNALS = ("utilisation", "demand")


@dataclass(frozen=True)
class TopologyAware:
    """Best fit at the smallest span: one PCIe switch, else one server, else one rack, else
    one InfiniBand zone, else anywhere; at each level the fullest candidate that fits."""

    name: str = "topology"

    def place(self, job: JobSpec, cluster: ClusterState) -> Placement | None:
        g = job.gpus
        if g > cluster.total_free:
            return None
        t = cluster.topology
        # one PCIe switch: the fullest that fits, ties to the fullest server (keeps whole
        # servers free for big gangs)
        best, best_key = -1, (0, 0)
        sw_free, srv_free = cluster.switch_free, cluster.server_free
        for w in range(len(sw_free)):
            f = sw_free[w]
            if f >= g:
                s = t.switch_server[w]
                key = (f, srv_free[s])
                if (best < 0 or key < best_key) and cluster.cores_free[s] >= g:
                    best, best_key = w, key
        if best >= 0:
            s = t.switch_server[best]
            devs = tuple(cluster.free_devices_on_switch(best)[:g])
            return Placement(devs, (core_take(cluster, job, s, g),))
        # one server
        s = _best_fit_server(cluster, g, emptiest=False)
        if s >= 0:
            return _build(cluster, job, [(s, g)], tight=True)
        # one rack, then one zone: the fullest group with enough free devices
        for groups, free, members in (
                (t.racks, cluster.rack_free, lambda i: t.racks[i].servers),
                (t.zones, cluster.zone_free,
                 lambda i: range(t.racks[t.zones[i].racks[0]].servers.start,
                                 t.racks[t.zones[i].racks[-1]].servers.stop))):
            for i in sorted((i for i in range(len(groups)) if free[i] >= g),
                            key=lambda i: (free[i], i)):
                takes = _greedy(cluster, _most_free_first(cluster, members(i)), g)
                if takes:
                    return _build(cluster, job, takes, tight=True)
        return _multi_server(cluster, job, tight=True)


@dataclass(frozen=True)
class MostFreeFirst:
    """Placement by GPU count alone (the Pollux artifact's Tiresias): take GPUs from the
    server with the most free ones (ties: lowest index), then the next, until the gang is
    complete. No consolidation and no topology: a 4-GPU gang may land as 3 + 1."""

    name: str = "count"

    def place(self, job: JobSpec, cluster: ClusterState) -> Placement | None:
        if job.gpus > cluster.total_free:
            return None
        return _multi_server(cluster, job, tight=True)
