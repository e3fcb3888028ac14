"""Cluster state: which devices and CPU cores are in use, as bitmaps, plus free counts per
server, PCIe switch, rack and zone so placement policies answer "where is room?" without
scanning devices.

Bitmaps are Python ints (bit i = device i free). We measured them against numpy bool
arrays in ``bench/simulator.py`` (gang alloc/free cycle and per-server free-set query):
for 2,048 devices the int masks win because a server's free set is one ``&`` and a shift,
while numpy pays a fixed call overhead per small slice.

The state is separate from the event loop (it knows nothing about time) so that the
simulator and a live executor drive the same object and the same policies.
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.cluster.core.jobs import JobSpec
from phalanx.cluster.core.topology import Topology


class AllocationError(RuntimeError):
    """A placement asked for devices or cores that are not free (a policy bug)."""


@dataclass(frozen=True)
class Placement:
    """A placement decision: the devices of a gang and the CPU cores taken on each of its
    servers (``cores`` pairs ``(server, n_cores)``, one per server used)."""

    devices: tuple[int, ...]
    cores: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Allocation:
    """A committed placement: also the exact core bitmask taken on each server."""

    devices: tuple[int, ...]
    device_mask: int
    core_masks: tuple[tuple[int, int], ...]   # (server, bitmask of cores)


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class ClusterState:
    """Free/used bitmaps over devices and CPU cores, and all-or-nothing gang allocation."""

    def __init__(self, topology: Topology) -> None:
        t = self.topology = topology
        self.capacity = t.num_devices
        self.free_mask = (1 << t.num_devices) - 1
        self.server_mask = [((1 << s.num_devices) - 1) << s.first_device for s in t.servers]
        self.switch_mask = []
        for s in t.servers:
            first = s.first_device
            for size in s.switch_sizes:
                self.switch_mask.append(((1 << size) - 1) << first)
                first += size
        self.server_free = list(t.server_size)
        self.switch_free = list(t.switch_size)
        self.rack_free = list(t.rack_size)
        self.zone_free = list(t.zone_size)
        self.total_free = t.num_devices
        self.empty_free = t.num_devices      # free devices on servers with nothing running
        self.core_free_mask = [(1 << s.cpu_cores) - 1 for s in t.servers]
        self.cores_free = [s.cpu_cores for s in t.servers]
        self.allocations: dict[int, Allocation] = {}
        # who holds each allocation (SchedulerCore.allocate records it): a placement that
        # weighs its neighbours (interference) reads their specs
        self.holders: dict[int, JobSpec] = {}
        # GPUs asked for by jobs waiting in the queue: the event loop (simulated or live)
        # keeps it current; demand-aware placement reads it as queue pressure
        self.queued_gpus = 0

    # ------------------------------------------------------------------ queries
    @property
    def busy(self) -> int:
        return self.capacity - self.total_free

    @property
    def utilisation(self) -> float:
        return 1.0 - self.total_free / self.capacity

    def free_devices(self, server: int) -> list[int]:
        return _bits(self.free_mask & self.server_mask[server])

    def free_devices_on_switch(self, switch: int) -> list[int]:
        return _bits(self.free_mask & self.switch_mask[switch])

    def usable_on_server(self, server: int) -> int:
        """Devices a new job can use on ``server``: each device needs at least one core."""
        f = self.server_free[server]
        c = self.cores_free[server]
        return min(f, c)

    @property
    def demand(self) -> float:
        """(busy + queued GPUs) / capacity: the load the cluster would carry if every
        waiting job ran now (can exceed 1)."""
        return (self.capacity - self.total_free + self.queued_gpus) / self.capacity

    @property
    def fragmentation(self) -> float:
        """Share of the free devices that sit on partly used servers (0 = every free
        device is on an empty server; 1 = no server is empty)."""
        return 1.0 - self.empty_free / self.total_free if self.total_free else 0.0

    # ------------------------------------------------------------------ mutation
    def allocate(self, job_id: int, placement: Placement) -> Allocation:
        """Commit a gang: all devices and cores, or nothing (raises, state untouched)."""
        if job_id in self.allocations:
            raise AllocationError(f"job {job_id} is already placed")
        mask = 0
        for d in placement.devices:
            mask |= 1 << d
        if not placement.devices or mask.bit_count() != len(placement.devices):
            raise AllocationError(f"job {job_id}: empty or repeated devices {placement.devices}")
        if mask & self.free_mask != mask:
            raise AllocationError(f"job {job_id}: devices {_bits(mask & ~self.free_mask)} "
                                  f"are in use")
        t = self.topology
        servers = {t.device_server[d] for d in placement.devices}
        core_req = dict(placement.cores)
        if set(core_req) != servers:
            raise AllocationError(f"job {job_id}: cores given for servers {sorted(core_req)} "
                                  f"but devices on {sorted(servers)}")
        core_masks = []
        for s, n in placement.cores:
            if n < 1 or n > self.cores_free[s]:
                raise AllocationError(f"job {job_id}: {n} cores on server {s}, "
                                      f"{self.cores_free[s]} free")
        # every check passed: now mutate (this is what makes the gang all-or-nothing)
        for s, n in placement.cores:
            if self.server_free[s] == t.server_size[s]:
                self.empty_free -= t.server_size[s]
            free = self.core_free_mask[s]
            take = 0
            for _ in range(n):
                low = free & -free
                take |= low
                free ^= low
            self.core_free_mask[s] = free
            self.cores_free[s] -= n
            core_masks.append((s, take))
        self.free_mask &= ~mask
        for d in placement.devices:
            s = t.device_server[d]
            self.server_free[s] -= 1
            self.switch_free[t.device_switch[d]] -= 1
            r = t.server_rack[s]
            self.rack_free[r] -= 1
            self.zone_free[t.rack_zone[r]] -= 1
        self.total_free -= len(placement.devices)
        alloc = Allocation(tuple(placement.devices), mask, tuple(core_masks))
        self.allocations[job_id] = alloc
        return alloc

    def release(self, job_id: int) -> Allocation:
        alloc = self.allocations.pop(job_id, None)
        if alloc is None:
            raise AllocationError(f"job {job_id} holds no allocation")
        self.holders.pop(job_id, None)
        t = self.topology
        self.free_mask |= alloc.device_mask
        for d in alloc.devices:
            s = t.device_server[d]
            self.server_free[s] += 1
            self.switch_free[t.device_switch[d]] += 1
            r = t.server_rack[s]
            self.rack_free[r] += 1
            self.zone_free[t.rack_zone[r]] += 1
        for s, m in alloc.core_masks:
            self.core_free_mask[s] |= m
            self.cores_free[s] += m.bit_count()
            if self.server_free[s] == t.server_size[s]:
                self.empty_free += t.server_size[s]
        self.total_free += len(alloc.devices)
        return alloc

    def check_invariants(self) -> None:
        """Counts agree with the bitmaps and no device/core is held twice (for tests)."""
        t = self.topology
        seen = 0
        for a in self.allocations.values():
            if a.device_mask & seen:
                raise AssertionError("a device is held by two jobs")
            seen |= a.device_mask
        full = (1 << t.num_devices) - 1
        if seen | self.free_mask != full or seen & self.free_mask:
            raise AssertionError("used and free device bitmaps disagree")
        for s in range(len(t.servers)):
            if self.server_free[s] != (self.free_mask & self.server_mask[s]).bit_count():
                raise AssertionError(f"server {s} free count is wrong")
            if self.cores_free[s] != self.core_free_mask[s].bit_count():
                raise AssertionError(f"server {s} core count is wrong")
        for w in range(t.num_switches):
            if self.switch_free[w] != (self.free_mask & self.switch_mask[w]).bit_count():
                raise AssertionError(f"switch {w} free count is wrong")
        empty = sum(f for f, n in zip(self.server_free, t.server_size) if f == n)
        if empty != self.empty_free:
            raise AssertionError("empty-server free count is wrong")
        if sum(self.rack_free) != self.total_free or sum(self.zone_free) != self.total_free:
            raise AssertionError("rack/zone free counts are wrong")
