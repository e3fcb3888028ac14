"""Every ordering and every placement policy through the same checks (optax-style
conformance): decisions are well-formed, inputs are never mutated, and each ordering x
placement pair drives a simulation that passes the shared checks."""

import copy
import math
from dataclasses import replace

import pytest
from cluster_simcheck import check_result, rows
from cluster_simcheck import placement as placement_of

from phalanx.cluster.core.allocator import ClusterState, Placement
from phalanx.cluster.core.jobs import JobSpec, JobState
from phalanx.cluster.core.topology import uniform
from phalanx.cluster.policies import (
    ORDERINGS,
    PLACEMENTS,
    FirstFit,
    LoadAdaptive,
    Pack,
    Spread,
    Tiresias,
    TopologyAware,
    make_ordering,
    make_placement,
)
from phalanx.cluster.policies.ordering import ResortEveryEvent
from phalanx.cluster.policies.placement import SpreadKeepEmpty
from phalanx.cluster.sim.event import SimConfig, Simulator
from phalanx.cluster.sim.traces import SyntheticSpec, TraceOptions, synthetic
from phalanx.errors import ConfigError


def states():
    out = []
    for i, (sub, g, dur, att, run, last) in enumerate([
            (0, 4, 500, 9000, True, 10), (5, 1, 100, 0, False, -1), (5, 2, 50, 400, False, 3),
            (9, 8, 9000, 50000, False, 1), (12, 1, 10, 0, False, -1)]):
        st = JobState(JobSpec(i, f"j{i}", sub, g, dur, dur, "bert"), remaining=dur,
                      attained=att, executed=att / g, running=run, last_start=last,
                      waiting_since=sub)
        out.append(st)
    return out


@pytest.mark.parametrize("name", sorted(ORDERINGS))
def test_ordering_contract(name):
    policy = make_ordering(name, 600.0)
    jobs = states()
    before = copy.deepcopy(jobs)
    order = policy.order(tuple(jobs), 100.0)
    assert isinstance(order, tuple) and sorted(order) == [j.id for j in jobs]
    assert jobs == before                                   # never mutates its input
    assert policy.order(tuple(reversed(jobs)), 100.0) == order   # input order irrelevant
    assert policy.order((), 0.0) == ()
    assert isinstance(policy.preemptive, bool)
    assert (policy.round_s or 0) > 0 or not policy.preemptive


def test_ordering_semantics():
    jobs = tuple(states())
    assert make_ordering("fifo").order(jobs, 0) == (0, 1, 2, 3, 4)
    assert make_ordering("sjf").order(jobs, 0)[:3] == (4, 1, 2)   # GPU-time 10, 100, 100
    assert make_ordering("las").order(jobs, 0)[:2] == (1, 4)          # attained 0
    assert make_ordering("rr").order(jobs, 0)[:2] == (1, 4)           # never ran
    t = Tiresias(thresholds=(1000.0,), starvation=2.0, round_s=600.0)
    assert t.order(jobs, 100.0) == (1, 2, 4, 0, 3)      # queue 0 by arrival, then queue 1
    # job 3 ran 50000/8 s; after waiting twice that it is promoted to the top queue
    assert t.queue(jobs[3], 9.0 + 2 * 6250.0) == 0
    assert t.order(jobs, 9.0 + 2 * 6250.0) == (1, 2, 3, 4, 0)   # FIFO inside queue 0


def _cluster_with_load():
    c = ClusterState(uniform(zones=2, racks=2, servers=2, devices=4, switches=2, cpu_cores=8))
    c.allocate(100, Placement((0, 1, 2), ((0, 3),)))
    c.allocate(101, Placement((9,), ((2, 1),)))
    return c


@pytest.mark.parametrize("name", sorted(PLACEMENTS))
@pytest.mark.parametrize("gpus", [1, 2, 3, 4, 6, 8, 16, 28, 29])
def test_placement_contract(name, gpus):
    c = _cluster_with_load()
    before = (c.free_mask, list(c.server_free), list(c.cores_free), dict(c.allocations))
    p = placement_of(name).place(JobSpec(0, "j", 0, gpus, 1, 1, "bert", cpu_per_gpu=2), c)
    assert (c.free_mask, list(c.server_free), list(c.cores_free), dict(c.allocations)) == before
    if gpus > c.total_free:
        assert p is None
        return
    assert p is not None, f"{name} found no room for {gpus} of {c.total_free} free"
    assert len(p.devices) == len(set(p.devices)) == gpus
    assert all(c.free_mask >> d & 1 for d in p.devices)
    c.allocate(1, p)      # the decision commits cleanly
    c.check_invariants()


def test_placement_semantics():
    job = JobSpec(0, "j", 0, 1, 1, 1, "bert")
    c = _cluster_with_load()
    t = c.topology
    # pack: the fullest server that fits (server 0 has 1 free); spread: an empty server
    assert t.device_server[Pack().place(job, c).devices[0]] == 0
    assert c.server_free[t.device_server[Spread().place(job, c).devices[0]]] == 4
    assert FirstFit().place(job, c).devices == (3,)
    # topology-aware: a 2-GPU gang goes onto one PCIe switch, the fullest that fits
    two = JobSpec(1, "j", 0, 2, 1, 1, "bert")
    d = TopologyAware().place(two, c).devices
    assert len({t.device_switch[x] for x in d}) == 1 and t.device_server[d[0]] == 2
    # load-adaptive: spread when idle, pack when busy
    idle = ClusterState(t)
    idle.allocate(5, Placement((0,), ((0, 1),)))
    assert t.device_server[LoadAdaptive(0.5).place(job, idle).devices[0]] != 0
    assert t.device_server[LoadAdaptive(0.0).place(job, idle).devices[0]] == 0


@pytest.fixture(scope="module")
def small_trace(data_dir):
    return synthetic(SyntheticSpec(jobs=40, rate_per_h=40.0, median_s=1800.0, max_gpus=16),
                     TraceOptions(data_dir, seed=3)).jobs


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
@pytest.mark.parametrize("ordering", sorted(ORDERINGS))
def test_every_pair_simulates(ordering, placement, small_trace, perf):
    topo = uniform(zones=1, racks=2, servers=2, devices=8, switches=2, cpu_cores=32)

    def go():
        return Simulator(topo, small_trace, make_ordering(ordering, 1200.0),
                         placement_of(placement), perf,
                         config=SimConfig(check_invariants=True)).run()

    res = go()
    check_result(res, len(small_trace), topo.num_devices)
    assert rows(res) == rows(go())


def test_spread_keep_empty_never_breaks_a_free_server_while_others_have_room():
    c = _cluster_with_load()          # server 0: 1 free, server 2: 3 free, others empty
    t = c.topology
    one = JobSpec(0, "j", 0, 1, 1, 1, "bert")
    p = SpreadKeepEmpty().place(one, c)
    # partly used servers only; server 2's free switch (2 of 2 free) beats server 0's last slot
    assert t.device_server[p.devices[0]] == 2 and c.switch_free[t.device_switch[p.devices[0]]] == 2
    # a gang no partly used server holds goes to an empty server
    four = JobSpec(1, "j", 0, 4, 1, 1, "bert")
    assert c.server_free[t.device_server[SpreadKeepEmpty().place(four, c).devices[0]]] == 4
    # plain Spread takes an empty server even for one GPU
    assert c.server_free[t.device_server[Spread().place(one, c).devices[0]]] == 4


def test_load_adaptive_demand_signal_and_hysteresis():
    c = ClusterState(uniform(servers=4, devices=4, switches=2, cpu_cores=16))   # 16 GPUs
    c.allocate(9, Placement((0,), ((0, 1),)))
    t = c.topology
    job = JobSpec(0, "j", 0, 1, 1, 1, "bert")
    la = LoadAdaptive(0.5, signal="demand", hysteresis=0.25)

    def packs() -> bool:
        return t.device_server[la.place(job, c).devices[0]] == 0
    c.queued_gpus = 1                 # busy 1 + queued 1 = 2/16: spread
    assert la.load(job, c) == 2 / 16 and not packs()
    c.queued_gpus = 8                 # 9/16 >= 0.5: pack (utilisation alone says 1/16)
    assert packs() and t.device_server[LoadAdaptive(0.5).place(job, c).devices[0]] != 0
    c.queued_gpus = 4                 # 5/16 = 0.31: inside the hysteresis band, still pack
    assert packs()
    c.queued_gpus = 2                 # 3/16 < 0.25: back to spread
    assert not packs()
    # without hysteresis the same dip switches straight back
    plain = LoadAdaptive(0.5, signal="demand")
    c.queued_gpus = 8
    plain.place(job, c)
    c.queued_gpus = 4
    assert t.device_server[plain.place(job, c).devices[0]] != 0
    with pytest.raises(ConfigError, match="signal"):
        LoadAdaptive(signal="vibes")
    with pytest.raises(ConfigError, match="hysteresis"):
        LoadAdaptive(0.3, hysteresis=0.5)


def test_simulator_keeps_queued_demand(small_trace, perf):
    topo = uniform(zones=1, racks=1, servers=2, devices=8, switches=2, cpu_cores=32)
    seen = []

    class Spy:
        name = "spy"

        def place(self, job, cluster):
            seen.append((cluster.queued_gpus, sum(s.gpus for s in sim.waiting.values())))
            return Pack().place(job, cluster)

    sim = Simulator(topo, small_trace, make_ordering("fifo"), Spy(), perf)
    res = sim.run()
    assert seen and all(a == b for a, b in seen)     # always the waiting jobs' GPUs
    assert sim.cluster.queued_gpus == 0 and all(j.end > 0 for j in res.jobs)


@pytest.mark.parametrize("ordering", sorted(ORDERINGS))
def test_cached_order_equals_resorting_every_event(ordering, small_trace, perf):
    """The incremental fill pass (order reused until the policy says it expires) gives the
    exact schedule of re-sorting the queue at every event."""
    topo = uniform(zones=1, racks=1, servers=2, devices=8, switches=2, cpu_cores=32)
    pol = make_ordering(ordering, 900.0)
    jobs = [replace(j, submit=j.submit / 4) for j in small_trace]      # long queues

    def go(o):
        return Simulator(topo, jobs, o, make_placement("topology"), perf).run()

    fast = go(pol)
    assert rows(fast) == rows(go(ResortEveryEvent(pol)))
    assert max(fast.queue) >= 10      # the queue really was long enough to matter


def test_tiresias_order_expires_at_the_next_promotion():
    t = Tiresias(thresholds=(1000.0,), starvation=2.0, round_s=600.0)
    jobs = tuple(states())
    # waiting jobs that ran: job 2 (200 s, since 5) is promoted at 5 + 2 x max(200, slot),
    # job 3 (6250 s, since 9) at 9 + 2 x 6250; jobs that never ran are never promoted
    assert t.stable_until(jobs, 100.0) == 5.0 + 2 * 600.0
    assert t.stable_until(jobs, 1205.0) == 9.0 + 2 * 6250.0
    assert t.stable_until(jobs, 9.0 + 2 * 6250.0) == math.inf
    assert make_ordering("las").stable_until(jobs, 0.0) == math.inf


# ------------------------------------------------------------------ elastic: goodput

def _views():
    from phalanx.cluster.core.view import JobView

    return (JobView(0, "bert", 0.0, 0, 500.0, 0, 0.0),
            JobView(1, "cifar10", 5.0, 3, 1e5, 8, 3600.0),
            JobView(2, "ncf", 6.0, 0, 1e4, 0, 0.0),
            JobView(3, "yolov3", 7.0, 10, 5e4, 4, 100.0),
            JobView(4, "imagenet", 1.0, 0, 1e6, 16, 1e5),
            JobView(5, "deepspeech2", 9.0, 2, 2e4, 1, 60.0))


@pytest.mark.parametrize("priority", ["srpt", "las", "none"])
@pytest.mark.parametrize("capacity", [1, 7, 64])
def test_goodput_contract(priority, capacity, data_dir):
    """GPU counts within the cluster and each application's limits, batches within the
    validated range and per-GPU limits, input untouched, input order irrelevant."""
    from phalanx.cluster.model.profiles import load_pollux_apps
    from phalanx.cluster.policies.goodput import GoodputPolicy

    apps = load_pollux_apps(data_dir)
    pol = GoodputPolicy(apps, priority=priority)
    views = _views()
    before = copy.deepcopy(views)
    out = pol.allocate(views, capacity, 100.0)
    assert views == before
    assert set(out) == {v.id for v in views}
    assert sum(c.gpus for c in out.values()) <= capacity
    for v in views:
        c, app = out[v.id], apps[v.app]
        assert 0 <= c.gpus <= min(capacity, pol.max_gpus(app, capacity))
        if c.gpus == 0:
            assert c.config is None
            continue
        cfg = c.config
        assert cfg.replicas == c.gpus
        assert app.init_batch <= cfg.batch <= app.max_batch
        assert app.min_local_bsz <= cfg.atomic <= app.max_local_bsz
    if any(c.gpus == 0 for c in out.values()):
        assert sum(c.gpus for c in out.values()) == capacity   # nobody waits on a free GPU
    assert pol.allocate(tuple(reversed(views)), capacity, 100.0) == out


def test_goodput_simulates_within_limits(data_dir):
    """The elastic policy through the interval engine (bitmaps checked every interval):
    every job finishes, no allocation exceeds the cluster or the job's limit."""
    from phalanx.cluster.model.families import load_profiles
    from phalanx.cluster.model.perf import PerfModel
    from phalanx.cluster.model.profiles import load_pollux_apps
    from phalanx.cluster.policies.goodput import GoodputPolicy
    from phalanx.cluster.sim.interval import IntervalConfig, IntervalSimulator
    from phalanx.cluster.sim.traces import load_trace

    apps = load_pollux_apps(data_dir)
    topo = uniform(racks=1, servers=4, devices=4)
    jobs = load_trace("pollux:1", TraceOptions(data_dir, limit=25), topo).jobs
    pol = GoodputPolicy(apps)
    sim = IntervalSimulator(topo, jobs, make_ordering("fifo"), make_placement("pack"),
                            PerfModel(load_profiles(data_dir), apps), config=IntervalConfig(
                                check_invariants=True), elastic=pol)
    res = sim.run()
    assert len(res.jobs) == 25 and all(j.end > j.submit for j in res.jobs)
    assert max(res.busy) <= 16
    for j in res.jobs:
        for _, devices in j.placements:
            assert 1 <= len(devices) <= pol.max_gpus(apps[j.spec.model], 16)


def test_goodput_fixed_batch_keeps_each_jobs_batch(data_dir):
    """The ablation: GPU counts only; each job trains its own batch (the artifact's rule
    of per-GPU batch and accumulation), never on more GPUs than its batch can feed."""
    from dataclasses import replace as dc_replace

    from phalanx.cluster.model.profiles import load_pollux_apps
    from phalanx.cluster.policies.goodput import GoodputPolicy

    apps = load_pollux_apps(data_dir)
    pol = GoodputPolicy(apps, fixed_batch=True)
    batches = {"bert": 96, "cifar10": 512, "ncf": 32768, "yolov3": 64, "imagenet": 1600,
               "deepspeech2": 80}
    views = tuple(dc_replace(v, batch=batches[v.app]) for v in _views())
    out = pol.allocate(views, 64, 0.0)
    assert sum(c.gpus for c in out.values()) <= 64
    for v in views:
        c, app = out[v.id], apps[v.app]
        assert c.gpus <= v.batch // app.min_local_bsz
        if c.gpus:
            assert c.config == app.batch_config(c.gpus, v.batch)


def _elastic_policies():
    """Every elastic policy of the catalog, built as ``phalanx simulate`` builds it: on
    Pollux's cluster, and on Sia's cluster of several GPU types (first jobs only)."""
    from phalanx.cluster.policies.catalog import ELASTIC
    from phalanx.cluster.sim.run import SimulateOptions, load_inputs, make_elastic

    homog = SimulateOptions(trace="pollux:1", cluster="pollux-64", limit=8)
    typed = SimulateOptions(trace="sia:philly:1", cluster="sia-64", limit=8)
    built = []
    for opts in (homog, typed):
        inputs = load_inputs(opts)
        for name in ELASTIC:
            if name in ("sia", "gavel") and opts is homog:
                continue    # they need GPU types
            built.append((f"{name}@{opts.cluster}", make_elastic(replace(opts, ordering=name),
                                                                 inputs), inputs))
    return built


def test_every_elastic_policy_declares_its_inputs():
    """One declared interface (``core.view.ElasticPolicy``): each policy of the catalog
    answers ``learner_for`` (a learning policy names a model, the others None), forgets a
    finished job, and takes the GPUs others hold as a keyword-only ``held``."""
    import inspect

    from phalanx.cluster.model.learned import Learner

    learns = {"goodput@pollux-64", "pollux@pollux-64", "pollux@sia-64"}
    for label, pol, _ in _elastic_policies():
        sig = inspect.signature(pol.allocate)
        assert sig.parameters["held"].kind is inspect.Parameter.KEYWORD_ONLY, label
        untyped = pol.learner_for("")
        assert isinstance(untyped, Learner) == (label in learns), label
        if label in ("sia@sia-64", "goodput@sia-64"):
            assert isinstance(pol.learner_for("rtx"), Learner), label  # one per type
        pol.finished(12345)      # a job it never saw: nothing to forget, no error


def test_held_devices_of_a_type_go_to_nobody():
    """The typed policies (sia, gavel, our typed goodput) give no job a type whose GPUs
    are all ``held`` by jobs outside the policy; with nothing held the same jobs do get
    that type (so the check is not vacuous)."""
    from phalanx.cluster.core.view import JobView

    for label, pol, inputs in _elastic_policies():
        if not label.endswith("sia-64") or label.startswith("pollux"):
            continue
        types = {s.device_type: 0 for s in inputs.topology.servers}
        for s in inputs.topology.servers:
            types[s.device_type] += s.num_devices
        views = tuple(JobView(j.id, j.model, 0.0, 0, None, 0, 0.0, j.batch_size,
                              requested=j.gpus) for j in inputs.trace.jobs)
        free = pol.allocate(views, sum(types.values()), 0.0)
        used = {c.device_type for c in free.values() if c.gpus}
        assert used, label
        for t in sorted(used):
            held = {t: types[t]}
            out = pol.allocate(views, sum(types.values()) - types[t], 0.0, held=held)
            assert all(c.device_type != t for c in out.values() if c.gpus), (label, t)


def test_no_side_channel_to_a_policy_or_an_executor():
    """In ``phalanx/cluster`` nothing probes a policy or an executor with ``getattr`` or
    writes an attribute onto a policy from outside it: what they take and give is in
    their declared interfaces (``ElasticPolicy``, ``Executor``)."""
    import ast
    from pathlib import Path

    import phalanx.cluster

    root = Path(phalanx.cluster.__file__).parent
    bad = []
    words = ("policy", "elastic", "executor")
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and node.args
                    and any(w in ast.unparse(node.args[0]) for w in words)):
                bad.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(node)}")
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Attribute)
                            and any(w in t.value.attr for w in words)):
                        bad.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(t)}")
    assert not bad, "side channels:\n" + "\n".join(bad)
