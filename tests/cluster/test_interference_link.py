"""The ``link`` level of pairwise interference (issue 49): jobs across servers share those
servers' links. The table reads it, the pair load adds it for a job across servers (and
only from others across servers on one of its servers), both simulators price it and the
``interference`` placement keeps a gang off busy links. Times hand-computed."""

from __future__ import annotations

import pytest

from phalanx.cluster.core.allocator import ClusterState, Placement
from phalanx.cluster.core.jobs import JobSpec
from phalanx.cluster.core.topology import uniform
from phalanx.cluster.model.colocated import pair_loads
from phalanx.cluster.model.interference import CoLocation, Pair, PairTable, table_from_json
from phalanx.cluster.policies.placement_catalog import make_placement
from phalanx.errors import DataError

SYNC, SINGLE = "mlp-sync-2", "mlp-single-1"


def link_table(kept: float = 0.5) -> PairTable:
    """Two sync jobs on one link keep ``kept`` each; a single-process job never uses it."""
    return PairTable({SYNC: {}, SINGLE: {}},
                     [Pair("link", SYNC, SYNC, kept, kept),
                      Pair("link", SINGLE, SYNC, 1.0, 1.0)], "test")


def test_the_table_reads_level_link_and_refuses_a_misspelt_level() -> None:
    data = link_table().to_json()
    assert table_from_json(data).levels() == ["link"]
    data["pairs"][0]["level"] = "lnk"
    with pytest.raises(DataError, match="level must be one of core, server, link, device"):
        table_from_json(data)


def test_link_load_counts_each_job_across_servers_and_nothing_without_the_level() -> None:
    co = CoLocation(link_table(0.4))
    assert co.link_load(SYNC, [SYNC]) == pytest.approx(1 / 0.4 - 1)
    assert co.link_load(SYNC, [SYNC, SYNC]) == pytest.approx(2 * (1 / 0.4 - 1))
    assert co.link_load(SINGLE, [SYNC]) == pytest.approx(0.0)
    core_only = CoLocation(PairTable({SYNC: {}}, [Pair("core", SYNC, SYNC, 0.5, 0.5)]))
    assert core_only.link_load(SYNC, [SYNC]) == 0.0


def _hold(cluster: ClusterState, jid: int, devices: tuple[int, ...], kind: str) -> None:
    t = cluster.topology
    per: dict[int, int] = {}
    for d in devices:
        per[t.device_server[d]] = per.get(t.device_server[d], 0) + 1
    cluster.allocate(jid, Placement(devices, tuple((s, n) for s, n in per.items())))
    cluster.holders[jid] = JobSpec(jid, f"j{jid}", 0.0, len(devices), 1.0, 1.0,
                                   kind.split("-")[0], kind=kind)


def test_pair_loads_share_a_link_only_between_jobs_across_servers() -> None:
    """Three servers of 2: job 0 across servers 0-1, job 1 across 1-2 (they meet on
    server 1's link), job 2 on server 2 alone: 0 and 1 load each other by the pair, job
    2 uses no link and adds nothing (the table has no core or server level)."""
    cluster = ClusterState(uniform(1, 1, 3, 2, switches=1))
    _hold(cluster, 0, (0, 2), SYNC)
    _hold(cluster, 1, (3, 4), SYNC)
    _hold(cluster, 2, (5,), SINGLE)
    loads = pair_loads(cluster, {0: SYNC, 1: SYNC, 2: SINGLE}, CoLocation(link_table(0.5)))
    assert loads == pytest.approx({0: 1.0, 1: 1.0, 2: 0.0})


@pytest.mark.parametrize("engine", ["event", "interval"])
def test_both_simulators_slow_two_jobs_that_share_a_link(perf, engine) -> None:
    """Two 3-GPU jobs of 100 s on three servers of 2: pack gives one servers 0-1, the
    other 1-2; sharing server 1's link each keeps 0.5 and takes 200 s (the interval
    engine starts them at its first boundary, 60). A table of level server only: 100 s
    (on server 1 they share its switch, level core, which that table lacks: no cost)."""
    from phalanx.cluster.model.perf import PerfModel, PerfOptions
    from phalanx.cluster.policies import FIFO, Pack
    from phalanx.cluster.sim.event import Simulator
    from phalanx.cluster.sim.interval import IntervalConfig, IntervalSimulator

    topo = uniform(1, 1, 3, 2, switches=1, cpu_cores=16)
    jobs = [JobSpec(i, f"j{i}", 0.0, 3, 100.0, 100.0, "ResNet-18", cpu_per_gpu=1, kind=SYNC)
            for i in range(2)]
    start = 60.0 if engine == "interval" else 0.0
    for table, took in ((link_table(0.5), 200.0),
                        (PairTable({SYNC: {}}, [Pair("server", SYNC, SYNC, 0.5, 0.5)]), 100.0)):
        pm = PerfModel(perf.profiles, perf.pollux, PerfOptions(cpu=False), co=CoLocation(table))
        if engine == "event":
            res = Simulator(topo, jobs, FIFO(), Pack(), pm).run()
        else:
            res = IntervalSimulator(topo, jobs, FIFO(), Pack(), pm, config=IntervalConfig(
                interval_s=60.0, restart_cost_s=0.0, restart_first=False)).run()
        assert [len({topo.device_server[d] for d in j.placements[0][1]}) for j in res.jobs] \
            == [2, 2]
        assert [j.end for j in res.jobs] == pytest.approx([start + took] * 2)


def test_the_interference_placement_keeps_a_gang_off_a_busy_link() -> None:
    """Four servers of 4: job 0 across servers 0-1 (2 + 2), jobs 2 and 3 on servers 2 and
    3 alone (2 each). A 4-GPU sync gang fits no server: pack takes servers 0-1 (the most
    free, first by index) and shares job 0's link; the interference placement, whose table
    says two sync jobs on one link keep 0.5, takes servers 2-3, whose jobs use no link."""
    cluster = ClusterState(uniform(1, 1, 4, 4, switches=1))
    _hold(cluster, 0, (0, 1, 4, 5), SYNC)
    _hold(cluster, 2, (8, 9), SINGLE)
    _hold(cluster, 3, (12, 13), SINGLE)
    gang = JobSpec(1, "j1", 0.0, 4, 1.0, 1.0, "mlp", kind=SYNC)
    t = cluster.topology
    servers = lambda p: sorted({t.device_server[d] for d in p.devices})  # noqa: E731
    assert servers(make_placement("pack").place(gang, cluster)) == [0, 1]
    policy = make_placement("interference", co=CoLocation(link_table(0.5)))
    assert servers(policy.place(gang, cluster)) == [2, 3]
    # on servers 0-1 it would lose half its rate and take half of job 0's: 2 + 2 GPUs
    busy = make_placement("pack").place(gang, cluster)
    assert policy.cost(gang, busy, cluster) == pytest.approx(4 * 0.5 + 4 * 0.5)
