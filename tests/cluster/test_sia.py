"""GPU types end to end in the interval engine (issue 35): Sia's cluster, workloads and
per-type profiles, a job on one type at a time, and the reference policies (sia, gavel,
pollux unaware of types) on short Sia workloads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from phalanx.cluster.core.clusters import default_data_dir, resolve_cluster
from phalanx.cluster.core.view import Choice
from phalanx.cluster.policies.gavel import gavel_throughput
from phalanx.cluster.policies.sia import solve_sia_milp
from phalanx.cluster.policies.typed_base import TypeInfo, cluster_types, one_gpu_throughput
from phalanx.cluster.sim.interval import IntervalConfig, IntervalSimulator
from phalanx.cluster.sim.run import SimulateOptions, apply_preset, load_inputs, simulate
from phalanx.errors import ConfigError, DataError

DATA = default_data_dir()
pytestmark = pytest.mark.skipif(not (DATA / "sia" / "workloads").exists(),
                                reason="../shared/data/sia missing")


def _opts(policy: str, trace: str = "sia:philly:1", limit: int = 12, **kw) -> SimulateOptions:
    given = {"trace": trace, "ordering": policy, "limit": limit, "data_dir": DATA, **kw}
    return SimulateOptions.from_dict(apply_preset("sia-artifact", given))


@pytest.fixture(scope="module")
def inputs():
    return load_inputs(_opts("sia"))


def test_sia_64_is_sias_cluster():
    topo = resolve_cluster("sia-64", DATA)
    per = {}
    for s in topo.servers:
        per.setdefault(s.device_type, []).append(s.num_devices)
    assert per == {"aws": [4] * 6, "rtx": [8] * 3, "dgx-ext": [8] * 2}
    assert topo.num_devices == 64
    assert [(t.name, t.node_gpus, t.nodes) for t in cluster_types(
        [(s.device_type, s.num_devices) for s in topo.servers])] == \
        [("aws", 4, 6), ("dgx-ext", 8, 2), ("rtx", 8, 3)]


def test_sia_workloads_load(inputs):
    jobs = inputs.trace.jobs
    assert len(jobs) == 12
    assert {j.model for j in jobs} <= {"bert", "cifar10", "deepspeech2", "imagenet", "yolov3"}
    # the first rows of philly workload 1: cifar10-0 at 107 s, 6 GPUs, batch 2048, then
    # deepspeech2-1 at 110 s (times count from the first arrival)
    assert (jobs[0].name, jobs[0].submit, jobs[0].gpus, jobs[0].batch_size) == \
        ("cifar10-0", 0.0, 6, 2048)
    assert (jobs[1].name, jobs[1].submit) == ("deepspeech2-1", 3.0)
    for bad in ("sia:philly:9", "sia:saturn:0", "sia:nope:1", "sia:philly"):
        with pytest.raises(ConfigError, match="sia:philly:1..8"):
            load_inputs(_opts("sia", trace=bad))


def test_each_type_has_its_own_speed(inputs):
    perf = inputs.perf
    t = {ty: perf.app_on("imagenet", ty).throughput((1,), 100.0)[0]
         for ty in ("aws", "rtx", "dgx-ext")}
    # measured: T4 slower than a 2080Ti, slower than an A100
    assert t["aws"] > t["rtx"] > t["dgx-ext"]
    # the bootstrap 1-GPU throughput ratio is the artifact's (max batch / max step time)
    x = {ty: one_gpu_throughput(perf.app_on("cifar10", ty)) for ty in ("aws", "dgx-ext")}
    rows = perf.app_on("cifar10", "aws").placements["1"]
    assert x["aws"] == pytest.approx(rows.bsz.max() / (rows.compute + rows.sync).max())
    assert x["dgx-ext"] > x["aws"]
    with pytest.raises(ConfigError, match="no profile of 'nope'"):
        perf.app_on("nope", "aws")


@dataclass
class _Spanning:
    """A policy that gives the first job one aws and one rtx server."""

    servers: tuple
    name: str = "spanning"
    adapts_batch: bool = field(default=False, init=False)
    uses_remaining: bool = field(default=False, init=False)

    def allocate(self, jobs, capacity, now, **kw):
        return {j.id: Choice(2, None, self.servers) if i == 0 else Choice(0, None)
                for i, j in enumerate(jobs)}

    def learner_for(self, device_type):
        return None

    def finished(self, jid):
        pass


def test_mixed_type_gang_is_refused_with_the_reason(inputs):
    topo = inputs.topology
    aws = next(s.index for s in topo.servers if s.device_type == "aws")
    rtx = next(s.index for s in topo.servers if s.device_type == "rtx")
    from phalanx.cluster.policies import make_ordering, make_placement

    sim = IntervalSimulator(topo, inputs.trace.jobs[:2], make_ordering("fifo", 60.0),
                            make_placement("count"), inputs.perf, None,
                            IntervalConfig(60.0, 30.0, True), _Spanning(((aws, 1), (rtx, 1))))
    with pytest.raises(ConfigError, match="across GPU types aws, rtx is refused"):
        sim.run()


def test_milp_respects_types_and_pins():
    types = (TypeInfo("a", 4, 1), TypeInfo("b", 8, 1))
    configs = [("a", 1, 1), ("a", 1, 4), ("b", 1, 1), ("b", 1, 8)]
    # three jobs all want the 8-GPU config of b most: only one fits
    cost = np.array([[-0.2, -0.5, -0.3, -1.0]] * 3)
    x = solve_sia_milp(cost, configs, types, {}, 1e-6)
    assert sorted(x).count(3) == 1
    used = {"a": 0, "b": 0}
    for j in x:
        if j >= 0:
            used[configs[j][0]] += configs[j][2]
    assert used["a"] <= 4 and used["b"] <= 8
    # a pinned job keeps its (worse) configuration
    x = solve_sia_milp(cost, configs, types, {2: 0}, 1e-6)
    assert x[2] == 0
    # GPUs held outside the MILP (a live job it cannot resize): 1 of b's 8 held, so b's
    # 8-GPU configuration fits no job, and b's 1-GPU one at most 7
    x = solve_sia_milp(cost, configs, types, {}, 1e-6, held={"b": 1})
    assert 3 not in x and x.count(1) == 1 and x.count(2) == 2, x
    x = solve_sia_milp(cost, configs, types, {}, 1e-6, held={"a": 4, "b": 8})
    assert x == [-1, -1, -1]


def test_gavel_throughput_reads_the_measured_profile(inputs):
    app = inputs.perf.app_on("cifar10", "rtx")
    # 1 GPU: always one accumulation step (gavel.py), calibrated by cifar10's 1.8
    step, sync = app.throughput((1,), 1024)
    assert gavel_throughput(app, 1, 2048, 8) == pytest.approx(
        1.0 / (step + (step - sync)) / 1.8)


@pytest.mark.parametrize("policy", ["sia", "gavel", "pollux"])
def test_reference_policies_run_jobs_on_one_type(policy):
    kw = {"interval_s": 360.0} if policy == "gavel" else {}
    if policy == "pollux":
        kw["pollux"] = {"generations": 5}
    opts = _opts(policy, limit=6, **kw)
    inputs = load_inputs(opts)
    s, res = simulate(opts, inputs)
    assert s.finished == 6
    topo = inputs.topology
    for st in res.jobs:
        assert st.placements
        for _, devices in st.placements:
            types = {topo.servers[topo.device_server[d]].device_type for d in devices}
            assert len(types) == 1
            if policy == "gavel":
                # Gavel runs each job at the trace's gang size
                assert len(devices) == st.spec.requested


# ------------------------------------------------------------------ equal information

FACTS = {"name", "init_batch", "max_batch", "min_local_bsz", "max_local_bsz", "epochs",
         "device_type", "restart_s"}


class TypedTrap:
    """A GPU type's application that gives the declared facts and the 1-GPU bootstrap
    profile (``placements["1"]``, what Sia gets at arrival) and raises on anything else:
    other placements, step times, gradient statistics, work."""

    def __init__(self, app):
        self._app = app

    @property
    def placements(self):
        return _OnlyOneGpu(self._app.placements)

    def __getattr__(self, name):
        if name in FACTS:
            return getattr(self._app, name)
        raise AssertionError(f"policy read {name} of the true profile")


class _OnlyOneGpu(dict):
    def __init__(self, rows):
        super().__init__({"1": rows["1"]})

    def __getitem__(self, key):
        if key != "1":
            raise AssertionError(f"policy read the {key} placement profile")
        return super().__getitem__(key)


def _watch(learner):
    seen = []
    observe = learner.observe

    def watched(jid, app, gpus, nodes, *rest, **kw):
        seen.append((jid, gpus))
        return observe(jid, app, gpus, nodes, *rest, **kw)

    learner.observe = watched
    return seen


def _run_trapped(policy_cls_or_factory, opts, inputs):
    from phalanx.cluster.policies import make_ordering, make_placement
    from phalanx.cluster.sim.run import elastic_inputs

    trapped = {t: {a: TypedTrap(x) for a, x in apps.items()}
               for t, apps in inputs.perf.typed.items()}
    pol = policy_cls_or_factory(trapped, elastic_inputs(opts, inputs).types(opts.ordering))
    seen = {t: _watch(lr) for t, lr in pol.tl.by_type.items()}
    sim = IntervalSimulator(inputs.topology, inputs.trace.jobs, make_ordering("fifo", 60.0),
                            make_placement("count"), inputs.perf, None,
                            IntervalConfig(60.0, 30.0, True, check_invariants=True), pol)
    return pol, seen, sim.run()


@pytest.mark.parametrize("policy", ["goodput", "goodput-start1", "goodput-share", "sia"])
def test_typed_policies_read_only_what_sia_knows(policy):
    """The policy gets trapped applications (facts and the 1-GPU bootstrap only), no
    remaining work, and observations only of set-ups its jobs ran on that type; every job
    finishes and first runs on one GPU (nothing known yet but the bootstrap), or on up to
    ``start`` GPUs of one node."""
    from phalanx.cluster.policies.goodput_typed import TypedOptions, make_typed_goodput
    from phalanx.cluster.policies.sia import SiaPolicy

    opts = _opts("sia" if policy == "sia" else "goodput", limit=6)
    inputs = load_inputs(opts)
    if policy == "sia":
        factory = SiaPolicy
    else:
        o = TypedOptions(share=policy == "goodput-share",
                         start=1 if policy == "goodput-start1" else TypedOptions().start)

        def factory(typed, types):
            return make_typed_goodput(typed, types, o)
    pol, seen, res = _run_trapped(factory, opts, inputs)
    assert not pol.uses_remaining
    assert len(res.jobs) == 6 and all(j.end > j.submit for j in res.jobs)
    topo = inputs.topology
    ran = {}
    first = [len(j.placements[0][1]) for j in res.jobs]
    if policy in ("goodput", "goodput-share"):   # start 4, the default
        assert 1 < max(first) <= 4, first   # an empty cluster: more than one GPU at once
    else:
        assert set(first) == {1}, first
    for j in res.jobs:
        for _, d in j.placements:
            t = topo.servers[topo.device_server[d[0]]].device_type
            ran.setdefault(t, set()).add((j.spec.id, len(d)))
    assert any(seen.values())
    for t, obs in seen.items():
        assert set(obs) <= ran.get(t, set()), t


def test_a_job_with_nothing_fitted_starts_on_up_to_start_gpus_of_one_node(inputs):
    """Before its first report a job's row holds its 1-GPU bootstrap x GPUs on the
    one-node configurations of up to ``start`` GPUs of each type (a prior of perfect
    scaling, the same for every job) and nothing elsewhere; start 1 is Sia's 1 GPU.
    A start that is not a whole number of GPUs in 1..64 is refused."""
    from phalanx.cluster.core.view import JobView
    from phalanx.cluster.policies.goodput_typed import TypedOptions, make_typed_goodput
    from phalanx.cluster.policies.typed_base import ZERO_ALLOC_GAIN
    from phalanx.cluster.sim.run import elastic_inputs

    typed, app = inputs.perf.typed, "cifar10"
    types = elastic_inputs(_opts("goodput"), inputs).types("goodput")
    v = JobView(1, app, 0.0, 0, None, 1, 60.0)
    rows = {k: make_typed_goodput(typed, types, TypedOptions(start=k)) for k in (1, 4, 8)}
    slowest = min(p.xput1[t][app] for p in rows.values() for t in p.xput1)
    for k, pol in rows.items():
        row = pol.goodput_row(v)
        for i, (t, n, g) in enumerate(pol.configs):
            if n == 1 and g <= k:
                assert row[i] == pytest.approx(pol.xput1[t][app] * g / slowest), (k, t, g)
            else:
                assert row[i] == ZERO_ALLOC_GAIN, (k, t, n, g)
    # aws nodes have 4 GPUs: start 8 offers 8 GPUs on rtx and dgx-ext, 4 on aws
    got = {(t, g) for (t, n, g), x in zip(rows[8].configs, rows[8].goodput_row(v))
           if x > ZERO_ALLOC_GAIN}
    assert ("aws", 4) in got and ("aws", 8) not in got and ("rtx", 8) in got
    for bad in (0, 65, 2.0, True):
        with pytest.raises(ConfigError, match=r"start \(--goodput-start\) must be a whole number"):
            TypedOptions(start=bad)


def test_a_change_is_worth_its_goodput_over_the_horizon_less_the_minimum_gain(inputs):
    """A configuration the job does not hold is valued T / (T + restart) / (1 + min gain)
    of its goodput; with ``restart="attained"`` T is at least the time the job has run at
    its current size (attained GPU-seconds over its GPUs)."""
    from phalanx.cluster.core.view import JobView
    from phalanx.cluster.policies.goodput_typed import TypedOptions, make_typed_goodput
    from phalanx.cluster.sim.run import elastic_inputs

    typed = inputs.perf.typed
    types = elastic_inputs(_opts("goodput"), inputs).types("goodput")
    fixed = make_typed_goodput(typed, types, TypedOptions())
    grows = make_typed_goodput(typed, types, TypedOptions(restart="attained"))
    r = fixed.restart_s["cifar10"]
    g = 1.0 + TypedOptions().min_gain
    assert g == 1.5                     # the default minimum gain, 0.5
    assert r > 0
    young = JobView(1, "cifar10", 0.0, 0, None, 4, 4 * 600.0)     # ran 600 s on 4 GPUs
    old = JobView(2, "cifar10", 0.0, 0, None, 4, 4 * 7200.0)      # 2 h on 4 GPUs
    for v in (young, old):
        assert fixed.change_factor(v, 0.0) == pytest.approx(1800 / (1800 + r) / g)
    assert grows.change_factor(young, 0.0) == pytest.approx(1800 / (1800 + r) / g)
    assert grows.change_factor(old, 0.0) == pytest.approx(7200 / (7200 + r) / g)
    waiting = JobView(3, "cifar10", 0.0, 0, None, 0, 4 * 7200.0)   # holds none: per GPU
    assert grows.change_factor(waiting, 0.0) == pytest.approx(28800 / (28800 + r) / g)
    with pytest.raises(ConfigError, match="restart 'age' unknown"):
        TypedOptions(restart="age")


def test_the_typed_guard_catches_a_leak():
    """Reading any profile but the 1-GPU bootstrap through the trap fails, and so does a
    policy that does it, or that reads remaining work."""
    from phalanx.cluster.core.view import UndeclaredRead
    from phalanx.cluster.policies.goodput_typed import TypedGoodputPolicy

    opts = _opts("goodput", limit=4)
    inputs = load_inputs(opts)
    trap = TypedTrap(inputs.perf.typed["aws"]["cifar10"])
    assert trap.placements["1"] is inputs.perf.typed["aws"]["cifar10"].placements["1"]
    with pytest.raises(AssertionError, match="the 14 placement"):
        trap.placements["14"]
    with pytest.raises(AssertionError, match="read throughput"):
        trap.throughput((2,), 64)

    class Peeks(TypedGoodputPolicy):
        def allocate(self, jobs, capacity, now, **kw):
            for j in jobs:
                self.typed["rtx"][j.app].throughput((8,), 32)
            return super().allocate(jobs, capacity, now, **kw)

    with pytest.raises(AssertionError, match="read throughput"):
        _run_trapped(Peeks, opts, inputs)

    class Remaining(TypedGoodputPolicy):
        def allocate(self, jobs, capacity, now, **kw):
            sum(j.remaining for j in jobs)
            return super().allocate(jobs, capacity, now, **kw)

    with pytest.raises(UndeclaredRead):
        _run_trapped(Remaining, opts, inputs)


@pytest.mark.parametrize("argv, message", [
    (["--preset", "sia-artifact", "--trace", "sia:saturn:11", "--policy", "sia"],
     "--trace sia:saturn:11: expected sia:philly:1..8 or sia:saturn:1..10"),
    (["--trace", "pollux:1", "--cluster", "pollux-64", "--policy", "gavel"],
     "--policy gavel: needs a cluster whose GPU types have per-type profiles"),
    (["--preset", "sia-artifact", "--trace", "sia:philly:1", "--policy", "goodput",
      "--goodput-priority", "srpt"], "srpt reads remaining work: an oracle ablation"),
    (["--trace", "pollux:1", "--cluster", "pollux-64", "--policy", "goodput",
      "--goodput-priority", "srpt"], "srpt reads remaining work: an oracle ablation"),
    (["--preset", "sia-artifact", "--trace", "sia:philly:1", "--policy", "goodput",
      "--profiles", "oracle"], "--profiles oracle: one GPU type only"),
])
def test_bad_sia_input_is_one_line(argv, message, capsys):
    from phalanx.cli import main

    try:
        code = main(["simulate", "--no-progress", "--limit", "4", *argv])
    except SystemExit as e:
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("phalanx: error: ") and message in err[0]


def test_gavel_gets_360_s_rounds_under_the_preset():
    assert _opts("gavel").interval_s == 360.0
    assert _opts("gavel", interval_s=60.0).interval_s == 60.0
    assert _opts("sia").interval_s == 60.0


def test_interior_lp_is_optimal_and_splits_ties():
    """Gavel's LP as ECOS solved it: the optimum of the simplex, and where two GPU types
    tie, half on each (a vertex would put it all on one)."""
    from scipy.optimize import linprog

    from phalanx.cluster.policies.gavel import lp_interior

    rng = np.random.default_rng(1)
    n, k = 20, 3
    c = -rng.uniform(0.1, 2, n * k)
    a = np.zeros((k + n, n * k))
    scale = rng.integers(1, 9, n)
    for j in range(k):
        a[j, j::k] = scale
    for i in range(n):
        a[k + i, i * k:(i + 1) * k] = 1
    b = np.array([16, 24, 24] + [1] * n, dtype=float)
    x = lp_interior(c, a, b)
    assert c @ x == pytest.approx(linprog(c, A_ub=a, b_ub=b, method="highs").fun, rel=1e-6)
    assert (a @ x - b).max() < 1e-6 and x.min() > -1e-9
    tie = lp_interior(np.array([-1.0, -1.0]), np.array([[1.0, 1.0]]), np.array([1.0]))
    assert tie == pytest.approx([0.5, 0.5], abs=1e-6)


def test_gavel_breaks_equal_priorities_by_submission_order(inputs):
    """Three identical 24-GPU jobs: only aws and rtx (24 GPUs each) can hold one, and the
    three have equal priorities. The artifact's job list is in submission order, so the two
    earliest run, whatever order the engine hands the jobs over in (handed over as they
    came, our gavel restarted the rotating ImageNet gangs on fewer rounds than the
    artifact and ran saturn 10 at 0.83x its mean JCT; in submission order 1.00x)."""
    from phalanx.cluster.core.view import JobView
    from phalanx.cluster.sim.run import make_elastic

    opts = _opts("gavel", interval_s=360.0)
    views = [JobView(i, "cifar10", float(i), 0, None, 0, 0.0, batch=2048, requested=24)
             for i in (3, 2, 1)]
    for order in (views, views[::-1]):
        got = make_elastic(opts, inputs).allocate(order, 64, 0.0)
        assert {i for i, c in got.items() if c.gpus} == {1, 2}, got
        assert {got[1].device_type, got[2].device_type} == {"aws", "rtx"}


def test_interior_lp_survives_a_singular_newton_system():
    """Gavel's LP of a round of sia philly 7 (6 jobs, 3 types): at its 10th iteration the
    normal equations are singular to working precision (np.linalg.solve raised, and the
    run died); the least-squares direction reaches the simplex's optimum."""
    from scipy.optimize import linprog

    from phalanx.cluster.policies.gavel import lp_interior

    c = -np.array([1.0960101, 1.02253413, 0.70246133] * 3 + [
        0.29964907, 3.53686725, 0.57760515, 1.05316669, 3.12261212, 1.51831766,
        2.48577201, 11.44628219, 4.03939046])
    scale = [4, 4, 4, 16, 10, 16]
    a = np.zeros((9, 18))
    for j in range(3):
        a[j, j::3] = scale
    for i in range(6):
        a[3 + i, i * 3:(i + 1) * 3] = 1
    b = np.array([24, 16, 24] + [1] * 6, dtype=float)
    singular = []
    solve = np.linalg.solve

    def watched(k, r):
        try:
            return solve(k, r)
        except np.linalg.LinAlgError:
            singular.append(1)
            raise

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(np.linalg, "solve", watched)
        x = lp_interior(c, a, b)
    assert singular   # the case this test is about
    assert c @ x == pytest.approx(linprog(c, A_ub=a, b_ub=b, method="highs").fun, rel=1e-8)
    assert (a @ x - b).max() < 1e-6 and x.min() > -1e-9


REPORTS = Path(__file__).resolve().parents[2] / "reports" / "cluster" / "sia"


def test_the_study_table_compares_with_the_reference():
    """The artifact's figures come from reference.jsonl (not copied into the code)."""
    from phalanx.cluster.studies.sia import ABLATIONS, TUNE, Row, read_reference, render

    reference = read_reference(REPORTS / "reference.jsonl")
    assert len(reference) == 36   # sia and gavel on the 18 workloads
    ref = reference[("sia", "sia:philly:1")]
    assert ref == 1949.75
    rows = [Row("sia:philly:1", "sia", 1.0, ref * 1.05, 9000.0, 600.0, 4.0, 160, 1.0),
            Row("sia:philly:1", "goodput", 1.0, ref * 0.945, 8000.0, 590.0, 3.0, 160, 1.0),
            Row("sia:philly:5", "sia", 1.5, 3000.0, 9000.0, 600.0, 4.0, 160, 1.0),
            Row("sia:philly:5", "goodput", 1.5, 2700.0, 8000.0, 550.0, 3.0, 160, 1.0)]
    md = render(rows, reference)
    assert "| philly:1 | 1,950 | 2,047 | 1.050 |" in md
    assert "| 0.900 |" in md          # goodput / our sia on philly 1
    assert "| test: philly 5-8 (1) | 1.5 | 3,000 | 2,700 | 0.900 |" in md
    # per family, only workloads with both runs: one here
    assert "| sia | philly 1-8 (1) | 1,950 | 2,047 | 1.050 | 1.050-1.050 |" in md
    assert "| gavel |" not in md
    # an ablation's row: its mean over the tuning set against goodput's
    label = ABLATIONS[0][0]
    tuned = [Row(w, p, 1.0, 2000.0 if p == "goodput" else 2100.0, 1.0, 1.0, 1.0, 160, 1.0)
             for w in TUNE for p in ("goodput", label)]
    assert f"| {label} | 2,100 | 1.050 |" in render(tuned, reference)


def test_a_bad_reference_file_is_one_line(tmp_path):
    from phalanx.cluster.studies.sia import read_reference

    with pytest.raises(DataError, match="cannot read the Sia reference runs"):
        read_reference(tmp_path / "missing.jsonl")
    bad = tmp_path / "reference.jsonl"
    bad.write_text('{"policy": "sia", "trace": "sia:philly:1", "mean_jct_s": 1.0}\n{"policy": 1}\n')
    with pytest.raises(DataError, match=r"reference.jsonl:2: not a reference run"):
        read_reference(bad)


def test_a_study_row_records_its_commit_and_resolved_options():
    """Each row carries the commit that ran it and every section's fields as run."""
    import json

    from phalanx.cluster.studies.provenance import commit, resolved

    opts = _opts("goodput").merged({"typed": {"p": -0.5}})
    got = json.loads(resolved(opts))
    assert got["typed"]["p"] == -0.5 and got["ordering"] == "goodput"
    assert got["perf"]["interference"] is False and got["interval_s"] == 60.0
    assert "data_dir" not in got and got["preset"] == "sia-artifact"
    c = commit()
    assert c == "unknown" or len(c.removesuffix("+dirty")) >= 7


def test_knowledge_ablations_offline_fit_and_oracle(inputs):
    """ABLATIONS (more than Sia knows): after one 1-GPU report, ``offline-fit`` predicts
    with the model fitted to every measured point (not the 1-point fit of equal
    information) on every type; ``oracle`` predicts a configuration's goodput at the
    simulator's own step time, and the job picks that batch."""
    from phalanx.cluster.core.view import JobView
    from phalanx.cluster.model.learned import efficiency
    from phalanx.cluster.model.profiles import BatchConfig
    from phalanx.cluster.policies.goodput_typed import TypedOptions, make_typed_goodput
    from phalanx.cluster.policies.typed_knowledge import offline_fit
    from phalanx.cluster.sim.interval import run_step_time
    from phalanx.cluster.sim.run import elastic_inputs

    typed, app = inputs.perf.typed, "cifar10"
    types = elastic_inputs(_opts("goodput"), inputs).types("goodput")
    pols = {k: make_typed_goodput(typed, types, TypedOptions(knowledge=k))
            for k in ("equal", "offline-fit", "oracle")}
    a = typed["aws"][app]
    step, sync = a.throughput((1,), 64)
    grad = a.grad_stats(64, 0)
    v = JobView(1, app, 0.0, 0, None, 1, 60.0, placement=((0, 1),), device_type="aws")
    for p in pols.values():
        assert p._model("aws", v) is None          # nothing reported yet: the bootstrap
        p.learner_for("aws").observe(1, app, 1, 1, 64, step, sync, grad)
    eq, fit = pols["equal"]._model("aws", v), pols["offline-fit"]._model("aws", v)
    assert fit.params == offline_fit(a).params != eq.params
    assert fit.grad == eq.grad == grad             # its own statistics, as before
    assert pols["equal"]._model("rtx", v) is None  # equal: rtx only projected
    assert pols["offline-fit"]._model("rtx", v).params == offline_fit(typed["rtx"][app]).params
    assert not np.allclose(pols["equal"].goodput_row(v), pols["offline-fit"].goodput_row(v))
    # the whole profile lifts the growth cap; known_cap="own" keeps equal information's
    own = make_typed_goodput(typed, types, TypedOptions(knowledge="offline-fit",
                                                        known_cap="own"))
    own.learner_for("aws").observe(1, app, 1, 1, 64, step, sync, grad)
    assert own._cap(v) == pols["equal"]._cap(v) == 8 < pols["offline-fit"]._cap(v)
    # oracle: (2 nodes, 8 GPUs) of aws at the simulator's throughput
    pol = pols["oracle"]
    k = pol._model("aws", v)
    got = float(pol._raw(v, "aws", np.array([2.0]), np.array([8.0]))[0])
    cfg = pol.learner_for("aws").batch_config(1, app, 2, 8)
    assert cfg.replicas == 8 and cfg.atomic >= a.min_local_bsz
    true_t = run_step_time(a, (4, 4), BatchConfig(cfg.atomic, cfg.accum, 8))
    want = float(efficiency(cfg.batch, k.facts.init_batch, *grad)) * cfg.batch \
        / k.facts.init_batch / true_t
    assert got == pytest.approx(want, rel=1e-12)
    assert got != pytest.approx(float(pols["offline-fit"]._raw(v, "aws", np.array([2.0]),
                                                                  np.array([8.0]))[0]))


@pytest.mark.parametrize(("cluster", "kw", "named"), [
    # the drift of issue 48 (a "share" variant on sia-64 set the learned policy's switch,
    # which the typed policy that ran there never read) cannot recur: there is one learned
    # goodput policy and one section; the oracle ablation reads only the goodput section
    ("pollux-64", {"typed": {"share": True}}, "typed.share"),
    ("pollux-64", {"typed": {"min_gain": 0.3, "growth": 4.0}}, "typed.min_gain, typed.growth"),
])
def test_a_goodput_section_the_policy_does_not_read_is_refused(cluster, kw, named):
    from phalanx.cluster.sim.run import make_elastic

    opts = SimulateOptions.from_dict(apply_preset("pollux-artifact", {
        "trace": "pollux:1", "ordering": "goodput", "limit": 4, "data_dir": DATA,
        "goodput": {"profiles": "oracle"}, **kw}))
    inputs = load_inputs(opts)
    with pytest.raises(ConfigError, match=f"{named} not read"):
        make_elastic(opts, inputs)
    # the learned policy reads its section on either cluster, with the goodput section
    for given in ({"trace": "pollux:1", "cluster": "pollux-64"},
                  {"trace": "sia:philly:1", "cluster": "sia-64"}):
        ok = SimulateOptions.from_dict({**given, "ordering": "goodput", "limit": 4,
                                        "data_dir": DATA, "goodput": {"horizon_s": 900.0},
                                        **kw})
        pol = make_elastic(ok, load_inputs(ok))
        assert pol.name == "goodput" and pol.options == ok.typed and pol.horizon_s == 900.0


def test_the_study_runs_every_table_cell_once():
    """The study's runs: sia, gavel and goodput on all 18 workloads at load 1.0 (pollux
    where the artifact's can be compared), our sia and goodput again at 1.5x on the 14
    test workloads, the ablations on the 4 tuning ones; no run twice (the parallel runner
    keys rows by workload, label and load)."""
    from phalanx.cluster.studies.sia import (
        ABLATIONS,
        POLLUX_WORKLOADS,
        RUNS,
        TEST,
        TUNE,
        WORKLOADS,
        _tasks,
    )

    keys = [(w, label, load) for w, label, _, load in _tasks()]
    assert len(keys) == len(set(keys))
    assert len(keys) == (len(WORKLOADS) * (len(RUNS) - 1) + len(POLLUX_WORKLOADS)
                         + 2 * len(TEST) + len(TUNE) * len(ABLATIONS))
    assert [k for k in keys if k[1] == "pollux"] == [("sia:philly:1", "pollux", 1.0)]
    assert ("sia:saturn:10", "goodput", 1.5) in keys
    assert ("sia:philly:1", "goodput", 1.5) not in keys      # tuning workloads: load 1 only
    assert not [k for k in keys if k[1] == ABLATIONS[0][0] and k[0] not in TUNE]


def test_the_solver_s_stray_line_on_stdout_is_dropped(capfd):
    """HiGHS prints a debugging line to C's stdout whatever its options say; the MILP runs
    with file descriptor 1 on /dev/null, and what was printed around it still shows."""
    import os

    from phalanx.cluster.policies.sia import _quiet_stdout

    print("before", flush=True)
    with _quiet_stdout():
        os.write(1, b"HighsMipSolverData::transformNewIntegerFeasibleSolution\n")
    os.write(1, b"after\n")
    assert capfd.readouterr().out == "before\nafter\n"
