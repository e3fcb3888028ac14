"""The interval engine and ``--preset pollux-artifact`` (issue 14): the artifact's clock
(arrivals and completions seen at 60 s boundaries, 30 s restart on every allocation), its
Tiresias, fidelity to the artifact's published numbers, and the options' validation."""

import pytest
from test_bad_input import run_cli

from phalanx.cluster.sim.run import (
    PRESETS,
    SimulateOptions,
    apply_preset,
    load_inputs,
    simulate,
)
from phalanx.errors import ConfigError

# the Pollux artifact's published Tiresias mean JCT (s) on workloads 1..8 at 1.0x load
ARTIFACT_TIRESIAS = (2474, 5145, 3876, 3280, 3501, 3470, 5480, 5080)


def _trace(tmp_path, rows):
    p = tmp_path / "w.csv"
    p.write_text("name,time,application,num_replicas,batch_size\n"
                 + "".join(f"{r}\n" for r in rows))
    return str(p)


def _opts(data_dir, trace, **kw):
    given = {"trace": trace, "cluster": "uniform:1,1,1,1", "data_dir": data_dir, **kw}
    return SimulateOptions.from_dict(apply_preset("pollux-artifact", given))


def test_boundaries_and_restart_cost(tmp_path, data_dir):
    """Two 1-GPU ncf jobs on one GPU: the first is seen at 60 s, pays 30 s, runs its
    work; the second starts at the boundary after the first ends, not at its end."""
    trace = _trace(tmp_path, ["a,0,ncf,1,32768", "b,5,ncf,1,32768"])
    opts = _opts(data_dir, trace, ordering="fifo")
    inputs = load_inputs(opts)
    app = inputs.perf.pollux["ncf"]
    work_s = app.work_steps(1, 32768) * app.step_time((1,), 32768)
    _, res = simulate(opts, inputs)
    a, b = res.jobs
    assert a.start == 60.0 and a.end == pytest.approx(90.0 + work_s, abs=6)   # 10 epochs
    assert a.end % 60 != 0                       # the completion itself is not rounded ...
    assert b.start == 60.0 * (a.end // 60 + 1)   # ... but the GPU is free at the boundary
    assert b.end - b.start == pytest.approx(a.end - a.start, abs=1)
    # without the first-start restart cost both jobs finish 30 s earlier
    _, res2 = simulate(_opts(data_dir, trace, ordering="fifo", restart_first=False), inputs)
    assert res2.jobs[0].end == pytest.approx(a.end - 30, abs=1)
    # a 10-minute interval: the first job is only seen at 600 s
    _, res3 = simulate(_opts(data_dir, trace, ordering="fifo", interval_s=600.0), inputs)
    assert res3.jobs[0].start == 600.0


def test_tiresias_demotes_at_the_threshold_and_never_promotes(tmp_path, data_dir):
    """On one GPU, with a 120 GPU-s threshold: the first job is demoted after two
    intervals (at 180 s) and a newcomer seen at 240 s preempts it; the newcomer is demoted
    at 360 s in turn and, queue 1 being FIFO by demotion time, the first job resumes."""
    trace = _trace(tmp_path, ["long,0,cifar10,1,128", "short,200,ncf,1,256"])
    opts = _opts(data_dir, trace, ordering="tiresias", tiresias_thresholds=(120.0,))
    _, res = simulate(opts)
    long_, short = res.jobs
    assert short.start == 240.0 and long_.placements[1][0] == 360.0
    # when each placement ended (jobs.csv's stops): preempted at 240, done at its end
    assert long_.stops == [240.0, long_.end] and short.stops[0] == 360.0
    assert short.stops[-1] == short.end and len(short.stops) == len(short.placements)
    assert long_.service_marks[1] == (180.0, 120.0)
    _, res = simulate(_opts(data_dir, trace, ordering="tiresias"))
    assert res.jobs[0].preemptions == 0 and res.jobs[1].start > res.jobs[0].end


def test_count_placement_fills_the_most_free_node_first(data_dir):
    from phalanx.cluster.core.allocator import ClusterState
    from phalanx.cluster.core.jobs import JobSpec
    from phalanx.cluster.core.topology import uniform
    from phalanx.cluster.policies import make_placement

    c = ClusterState(uniform(racks=1, servers=3, devices=4))
    c.allocate(99, make_placement("count").place(JobSpec(99, "x", 0, 1, 1, 1, "bert"), c))
    c.allocate(98, make_placement("pack").place(JobSpec(98, "y", 0, 2, 1, 1, "bert"), c))
    p = make_placement("count").place(JobSpec(0, "j", 0, 6, 1, 1, "bert"), c)
    per = [sum(1 for d in p.devices if c.topology.device_server[d] == s) for s in range(3)]
    # server 0 has 1 free GPU, servers 1 and 2 have 4: the first of the most free, then
    # the next most free one, never consolidating
    assert per == [0, 4, 2]
    assert c.topology.device_server[p.devices[0]] == 1


def test_preset_reproduces_the_artifacts_tiresias(data_dir):
    """Fidelity: within +-10% of the artifact's published Tiresias on each workload."""
    for w, published in enumerate(ARTIFACT_TIRESIAS, start=1):
        opts = SimulateOptions.from_dict(apply_preset("pollux-artifact", {
            "trace": f"pollux:{w}", "ordering": "tiresias", "data_dir": data_dir}))
        s, _ = simulate(opts)
        assert s.finished == 160
        assert abs(s.mean_jct_s / published - 1) <= 0.10, (w, s.mean_jct_s, published)


def test_explicit_flags_override_the_preset():
    merged = apply_preset("pollux-artifact", {"placement": "pack", "restart_cost_s": 5.0})
    assert merged["placement"] == "pack" and merged["restart_cost_s"] == 5.0
    assert merged["interval_s"] == PRESETS["pollux-artifact"]["interval_s"] == 60.0
    assert merged["tiresias_thresholds"] == (57600.0,) and merged["starvation"] == 0.0
    with pytest.raises(ConfigError, match="--preset nope: unknown"):
        apply_preset("nope", {})


@pytest.mark.parametrize("args, text", [
    (("--interval", "0"), "--interval must be a finite number >= 1 seconds"),
    (("--interval", "inf"), "--interval must be a finite number >= 1 seconds"),
    (("--restart-cost", "-1"), "--restart-cost must be a finite number >= 0"),
    (("--restart-cost", "nan"), "--restart-cost must be a finite number >= 0"),
    (("--restart-first", "maybe"), "invalid choice: 'maybe'"),
    (("--tiresias-thresholds", "x"), "--tiresias-thresholds 'x': not a comma list"),
    (("--tiresias-thresholds", "500,100"), "strictly increasing, got 500.0,100.0"),
    (("--tiresias-thresholds", "0"), "--tiresias-thresholds must be finite GPU-seconds > 0"),
    (("--starvation", "-1"), "--starvation must be a finite number >= 0"),
    (("--starvation", "inf"), "--starvation must be a finite number >= 0"),
    (("--goodput-horizon", "0"), "--goodput-horizon must be a finite number > 0"),
    (("--goodput-priority", "fair"), "invalid choice: 'fair'"),
    (("--preset", "pollux"), "invalid choice: 'pollux'"),
    (("--policy", "goodput", "--trace", "synthetic:jobs=5"), "--policy goodput: needs Pollux"),
])
def test_bad_preset_options_are_one_line(args, text, capsys):
    rc, _, err = run_cli(capsys, "--preset", "pollux-artifact", "--trace", "pollux:1", *args)
    assert rc == 2 and text in err and err.count("\n") == 1, err


def test_preset_study_outputs(tmp_path):
    """The study's table and plot from rows (the runs themselves are the study's)."""
    from phalanx.cluster.studies.pollux_preset import (
        ARTIFACT_POLLUX,
        ELASTIC_RUNS,
        NON_ELASTIC,
        Row,
        read_rows,
        write_preset_outputs,
    )

    pairs = NON_ELASTIC + tuple((o, v) for o, v, _ in ELASTIC_RUNS)
    jct = {"tiresias": 50, "pollux": -100}
    rows = [Row(w, o, v, 1000.0 * w + jct.get(o, 0) + (-300 if v == "learned/none" else 0),
                160, 0, 0.5 * w) for w in range(1, 9) for o, v in pairs]
    write_preset_outputs(rows, tmp_path)
    assert read_rows(tmp_path / "pollux_preset.csv") == rows
    table = (tmp_path / "pollux_preset.md").read_text()
    assert "best non-elastic (fifo/count)" in table      # the lowest mean, first on ties
    assert "| 1 | 2,474 | 1,050 | 1,000 | 2,089 | 900 | 700 |" in table
    assert f"{ARTIFACT_POLLUX[7]:,}" in table and "(oracle ablation)" in table
    assert "uses declared epochs" in table and "learned/srpt" not in table
    # our pollux / artifact, goodput / our pollux, goodput / artifact on workload 1
    assert "| 0.431 | 0.778 | 0.335 |" in table
    assert "| **mean** | **4,038** | **4,550** |" in table
    assert "| pollux/learned | 0.5 | 1.0 |" in table       # wall times
    assert (tmp_path / "pollux_preset.png").stat().st_size > 10_000


def test_cli_preset_compare(tmp_path, capsys):
    import json

    rc, out, err = run_cli(capsys, "--preset", "pollux-artifact", "--trace", "pollux:3",
                           "--limit", "12", "--compare", "tiresias,goodput,fifo:pack",
                           "--out", str(tmp_path))
    assert rc == 0, err
    rows = json.loads((tmp_path / "compare.json").read_text())
    assert [(r["ordering"], r["placement"]) for r in rows] == [
        ("tiresias", "count"), ("goodput", "learned/none"), ("fifo", "pack")]
    assert all(r["cluster"] == "pollux-64" and r["finished"] == 12 for r in rows)
