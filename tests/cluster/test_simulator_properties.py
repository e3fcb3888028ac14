"""Properties of the event loop on random small workloads: no device shared by two jobs (the
bitmaps are verified after every event), gangs all-or-nothing, GPU-time conservation,
determinism, every job finishes."""

from cluster_simcheck import check_result, rows
from cluster_simcheck import placement as placement_of
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.cluster.core.jobs import JobSpec
from phalanx.cluster.core.topology import uniform
from phalanx.cluster.policies import ORDERINGS, PLACEMENTS, make_ordering
from phalanx.cluster.sim.event import SimConfig, Simulator

MODELS = ["ResNet-50", "bert", "LM", "A3C"]

job_lists = st.lists(st.tuples(st.floats(0, 20000), st.sampled_from([1, 1, 2, 4, 8, 12]),
                               st.floats(30, 30000), st.sampled_from(MODELS)),
                     min_size=1, max_size=25)


def specs(raw):
    raw = sorted(raw, key=lambda r: r[0])
    return [JobSpec(i, f"j{i}", t, g, d, d, m, cpu_per_gpu=2) for i, (t, g, d, m)
            in enumerate(raw)]


def run(jobs, ordering, placement, perf, slot=1800.0):
    topo = uniform(zones=1, racks=2, servers=2, devices=4, switches=2, cpu_cores=8)
    sim = Simulator(topo, jobs, make_ordering(ordering, slot), placement_of(placement), perf,
                    config=SimConfig(checkpoint_cost_s=30.0, check_invariants=True))
    return sim.run(), topo.num_devices


@settings(max_examples=25, deadline=None)
@given(raw=job_lists, ordering=st.sampled_from(sorted(ORDERINGS)),
       placement=st.sampled_from(sorted(PLACEMENTS)))
def test_random_workloads(raw, ordering, placement, perf):
    jobs = specs(raw)
    res, cap = run(jobs, ordering, placement, perf)
    check_result(res, len(jobs), cap)
    # determinism: the same input gives the same schedule, placement for placement
    res2, _ = run(jobs, ordering, placement, perf)
    assert rows(res) == rows(res2)


def test_preemptive_policy_preempts_and_pays_restore(perf):
    # one long job holds the cluster; a short one arrives: LAS must preempt at the next slot
    jobs = [JobSpec(0, "long", 0.0, 16, 20000.0, 20000.0, "A3C"),
            JobSpec(1, "short", 100.0, 16, 600.0, 600.0, "A3C")]
    res, cap = run(jobs, "las", "pack", perf, slot=1000.0)
    check_result(res, 2, cap)
    long, short = res.jobs
    assert long.preemptions >= 1 and short.start == 1000.0
    # the resumed long job lost checkpoint_cost_s (30 s) per resume on top of its work
    assert long.executed >= 20000.0 + 30.0 * long.preemptions - 1e-6
    res_fifo, _ = run(jobs, "fifo", "pack", perf)
    assert res_fifo.jobs[1].start == res_fifo.jobs[0].end   # FIFO never preempts
