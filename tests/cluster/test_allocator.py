"""Bitmap allocator: counts agree with bitmaps, gangs are all-or-nothing, no device or core
is ever held twice (hypothesis drives random alloc/free sequences)."""

import pytest
from cluster_simcheck import placement as placement_of
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.cluster.core.allocator import AllocationError, ClusterState, Placement
from phalanx.cluster.core.jobs import JobSpec
from phalanx.cluster.core.topology import uniform
from phalanx.cluster.policies.placement_catalog import PLACEMENTS


def snapshot(c: ClusterState):
    return (c.free_mask, list(c.server_free), list(c.switch_free), list(c.rack_free),
            list(c.zone_free), list(c.cores_free), list(c.core_free_mask), c.total_free,
            c.empty_free, dict(c.allocations))


def test_gang_is_all_or_nothing():
    c = ClusterState(uniform(servers=2, devices=4, switches=2, cpu_cores=8))
    c.allocate(1, Placement((0, 1), ((0, 2),)))
    before = snapshot(c)
    # device 1 is taken: nothing of the gang may be committed
    with pytest.raises(AllocationError, match="in use"):
        c.allocate(2, Placement((4, 5, 1), ((1, 2), (0, 1))))
    # too many cores on server 1 (8 there): again nothing changes
    with pytest.raises(AllocationError, match="cores"):
        c.allocate(3, Placement((4, 5), ((1, 9),)))
    with pytest.raises(AllocationError, match="cores given for servers"):
        c.allocate(4, Placement((4, 5), ((0, 1),)))
    assert snapshot(c) == before
    c.check_invariants()


def test_free_set_queries():
    c = ClusterState(uniform(racks=2, servers=2, devices=4, switches=2, cpu_cores=8))
    c.allocate(7, Placement((0, 2, 5), ((0, 2), (1, 4))))
    assert c.free_devices(0) == [1, 3] and c.free_devices_on_switch(1) == [3]
    assert c.server_free[:2] == [2, 3] and c.rack_free == [5, 8] and c.zone_free == [13]
    assert c.cores_free[:2] == [6, 4] and c.usable_on_server(1) == 3
    assert c.empty_free == 8 and abs(c.fragmentation - (1 - 8 / 13)) < 1e-12
    c.release(7)
    assert c.total_free == 16 and c.empty_free == 16
    with pytest.raises(AllocationError):
        c.release(7)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(1, 12), st.sampled_from(sorted(PLACEMENTS)),
                              st.booleans()), min_size=1, max_size=40))
def test_random_alloc_free_keeps_invariants(ops):
    c = ClusterState(uniform(zones=2, racks=2, servers=2, devices=4, switches=2, cpu_cores=6))
    live = []
    for i, (gpus, policy, free_one) in enumerate(ops):
        if free_one and live:
            c.release(live.pop(0))
        else:
            job = JobSpec(i, "j", 0.0, gpus, 1.0, 1.0, "ResNet-50", cpu_per_gpu=2)
            before = snapshot(c)
            p = placement_of(policy).place(job, c)
            assert snapshot(c) == before          # placement only reads the state
            if p is None:
                continue
            assert len(p.devices) == gpus
            c.allocate(i, p)
            live.append(i)
        c.check_invariants()
