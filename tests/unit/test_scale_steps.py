"""``phalanx scale steps`` without test hosts: a run's step time from its summary, the
compute fitted at N = 2 and 1000 Mbit/s reproduces that point, the held-out points are
predicted from it and the calibration alone, and bad input is one line."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from cli_run import run_main

from phalanx.scale import calibrate as cal
from phalanx.scale import step_check as sc
from phalanx.scale import wire_check as wc
from phalanx.scale.profile import profile_model

CAL = str(Path(__file__).resolve().parents[2] / "reports/experiments/scale/calibration-quiet.json")


def test_a_run_s_step_time_is_its_steady_rate_over_a_step_s_samples(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps(
        {"train_samples": 2560, "steps": 40, "samples_per_s": 160.0}))
    assert sc._step_s(tmp_path) == pytest.approx(64 / 160)
    (tmp_path / "summary.json").write_text(json.dumps(
        {"train_samples": 0, "steps": 0, "samples_per_s": 0.0}))
    with pytest.raises(Exception, match="measured no steady state"):
        sc._step_s(tmp_path)


def test_the_fit_point_is_exact_and_held_out_points_follow_the_links():
    """Ring at N=2: 60 ms measured at 1000 Mbit/s fixes the compute; at 20 Mbit/s the
    same compute plus the calibrated link's exchange of the MLP's 400 KB predicts the step
    (between the compute and compute + 2 x 400 KB at the rate)."""
    fitted = cal.load(CAL)["fitted"]
    found = {("mlp", "sync ring", 2, 1000.0): 0.060, ("mlp", "sync ring", 2, 20.0): 0.300,
             ("mlp", "sync ring", 3, 20.0): 0.400}
    pts = {(p.n, p.rate): p for p in sc.points(found, fitted, cores=8)}
    fit = pts[2, 1000.0]
    assert not fit.held_out and fit.predicted_s == pytest.approx(0.060, rel=1e-6)
    w = profile_model("mlp", wc.BATCH, repeats=1, input_shape=wc.INPUT["mlp"])
    slow = pts[2, 20.0]
    assert slow.held_out and fit.commit
    link = cal.link_for(fitted, 20.0)
    assert 0.06 < slow.predicted_s < 0.06 + 2 * w.grad_bytes / link.bandwidth
    # N = 3 sends more per worker (2 x 2/3 X against X) over the same link: slower
    assert pts[3, 20.0].predicted_s > slow.predicted_s
    # where the time goes: the ring's exchange is most of the step at 20 Mbit/s only
    assert slow.link_share > 0.5 > fit.link_share
    text = sc.table(list(pts.values()))
    assert "bandwidth-bound rates) | 2 |" in text and "| of them, link-bound" in text


def test_more_processes_than_cores_share_the_compute():
    """3 workers on 2 cores. The sync ring holds them in step: they compute at once, each
    at 2/3 of a core (1.5 x 50 ms), then exchange, at any rate: the step is the one with
    75 ms of compute on 8 cores. The parameter server's workers are timed by the event
    simulation on 2 cores: at least 1.5 x 50 ms, and where they wait on their links no
    more than all of the compute's slowdown on top."""
    fitted = cal.load(CAL)["fitted"]
    c = next(c for c in wc.cases(3, "mlp") if c.label == "sync ring")
    w = profile_model("mlp", wc.BATCH, repeats=1, input_shape=wc.INPUT["mlp"])
    fast, slow = cal.link_for(fitted, 1000.0), cal.link_for(fitted, 20.0)
    for link in (fast, slow):
        alone = sc._predict("mlp", c, 3, link, w, 0.05, cores=8)
        shared = sc._predict("mlp", c, 3, link, w, 0.05, cores=2)
        assert shared == pytest.approx(sc._predict("mlp", c, 3, link, w, 0.075, cores=8),
                                       rel=1e-9)
        assert shared > alone
    assert sc._predict("mlp", c, 3, fast, w, 0.05, cores=8) < 0.075
    # a PS run's shards are processes too, but they wait on their links: 3 workers count
    ps = next(c for c in wc.cases(3, "mlp") if c.label == "asp")
    assert ps.world == 5
    assert 0.075 <= sc._predict("mlp", ps, 3, fast, w, 0.05, cores=2) < 0.08
    own = sc._predict("mlp", ps, 3, slow, w, 0.05, cores=8)
    assert own < sc._predict("mlp", ps, 3, slow, w, 0.05, cores=2) <= own + 0.025


@pytest.mark.parametrize("args, text", [
    (("--models", "lenet5"), "--models: 'lenet5' is not one of mlp, gpt, ctr"),
    (("--sizes", "3"), "--sizes: must hold 2"),
    (("--rates", "0.5"), "--rates: 0.5 is not in 1..10000 Mbit/s"),
    (("--rates", "x"), "--rates: 'x' is not a comma-separated list of numbers"),
    (("--steps", "3"), "--steps: 3 is not in 8..10000"),
    (("--fit-repeats", "0"), "--fit-repeats: 0 is not in 1..9"),
    (("--run-s", "-1"), "--run-s: -1 is not in 0..600 seconds"),
    (("--calibration", "nope.json"), "--calibration nope.json: cannot read"),
    (("--models", "mlp", "--strategies", "zero-3,zero-9"), "--strategies: 'zero-9' is not "
     "one of asp, average k=8, bsp, model-parallel, pipeline M=4, ssp, sync main, sync ring, "
     "sync top-k 1%, zero-1, zero-3"),
    (("--tcp", "vegas9"), "--tcp: 'vegas9' is not one of this kernel's"),
])
def test_bad_input_is_one_line(capsys, tmp_path, args, text):
    rc, (_, err) = run_main(capsys, "scale", "steps", *args, "--out", str(tmp_path / "o"))
    assert rc == 2 and text in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()


def test_reuse_predicts_measured_steps_again(capsys, tmp_path):
    fitted = cal.load(CAL)["fitted"]
    found = {("mlp", "sync ring", 2, 1000.0): [0.070, 0.060, 0.065],
             ("mlp", "sync ring", 2, 20.0): [0.300]}
    pts = sc.points(found, fitted, cores=8)
    (tmp_path / "steps.json").write_text(json.dumps([p.__dict__ for p in pts]))
    assert sc.load_found(tmp_path / "steps.json") == found  # every run kept
    # a steps.json from before the runs were kept: its one figure a point
    old = [{k: v for k, v in p.__dict__.items() if k != "runs_s"} for p in pts]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert sc.load_found(tmp_path / "old.json") == {k: [statistics.median(v)]
                                                     for k, v in found.items()}
    rc, (out, _) = run_main(capsys, "scale", "steps", "--reuse", str(tmp_path / "steps.json"),
                            "--calibration", CAL, "--out", str(tmp_path / "again"))
    assert rc == 0 and "held out" in (tmp_path / "again" / "steps.md").read_text()
    (tmp_path / "bad.json").write_text("[1]")
    rc, (_, err) = run_main(capsys, "scale", "steps", "--reuse", str(tmp_path / "bad.json"),
                            "--calibration", CAL, "--out", str(tmp_path / "x"))
    assert rc == 2 and "not a steps.json" in err and err.count("\n") == 1


def test_across_reruns_gives_each_point_s_spread_and_the_error_against_its_median(
        capsys, tmp_path):
    """``--across A,B``: the same held-out point in two reruns (300 and 330 ms), each file
    predicted again with one model: a spread of 10% and the error against their median,
    315 ms; a point only one file has is left out; fewer than two files, one line."""
    fitted = cal.load(CAL)["fitted"]
    fit = ("mlp", "sync ring", 2, 1000.0)
    files = []
    for i, (held, extra) in enumerate(((0.300, True), (0.330, False))):
        found = {fit: [0.065], ("mlp", "sync ring", 2, 20.0): [held]}
        if extra:
            found[("mlp", "sync ring", 2, 100.0)] = [0.080]
        pts = sc.points(found, fitted, cores=8)
        path = tmp_path / f"r{i}" / "steps.json"
        path.parent.mkdir()
        path.write_text(json.dumps([p.__dict__ for p in pts]))
        files.append(path)
    rc, (out, _) = run_main(capsys, "scale", "steps", "--across", ",".join(map(str, files)),
                            "--calibration", CAL, "--cores", "8", "--out", str(tmp_path / "a"))
    assert rc == 0 and "noise or model" in out
    got = json.loads((tmp_path / "a" / "across.json").read_text())["points"]
    assert [(r["rate"], r["measured_s"]) for r in got] == [(20.0, [0.300, 0.330])]
    (r,) = got
    assert r["spread"] == pytest.approx(0.1)
    assert r["error"] == pytest.approx(r["predicted_s"] / 0.315 - 1)
    again = sc.points({fit: [0.065], ("mlp", "sync ring", 2, 20.0): [0.3]}, fitted, cores=8)
    assert r["predicted_s"] == pytest.approx(next(p.predicted_s for p in again
                                                  if p.rate == 20.0))
    rc, (_, err) = run_main(capsys, "scale", "steps", "--across", str(files[0]),
                            "--calibration", CAL, "--out", str(tmp_path / "b"))
    assert rc == 2 and "at least two steps.json" in err and err.count("\n") == 1


def test_fit_runs_are_spread_over_the_group_and_their_median_is_fitted():
    assert sc._order([100.0, 20.0], 2, 3) == [1000.0, 100.0, 1000.0, 20.0, 1000.0]
    assert sc._order([100.0, 20.0], 2, 1) == [1000.0, 100.0, 20.0]
    assert sc._order([100.0, 20.0], 3, 3) == [100.0, 20.0]  # no fit point at N = 3
    # the fit rate among --rates: held out at N = 3, the fit point's repeats at N = 2
    assert sc._order([1000.0, 20.0], 3, 3) == [1000.0, 20.0]
    assert sc._order([1000.0, 20.0], 2, 2) == [1000.0, 20.0, 1000.0]
    fitted = cal.load(CAL)["fitted"]
    runs = {("mlp", "sync ring", 2, 1000.0): [0.090, 0.060, 0.061],
            ("mlp", "sync ring", 2, 20.0): [0.300]}
    pts = {p.rate: p for p in sc.points(runs, fitted, cores=8)}
    one = {p.rate: p for p in sc.points({("mlp", "sync ring", 2, 1000.0): 0.061,
                                         ("mlp", "sync ring", 2, 20.0): 0.300},
                                        fitted, cores=8)}
    assert pts[1000.0].measured_s == 0.061 and pts[1000.0].runs_s == (0.090, 0.060, 0.061)
    assert pts[20.0].predicted_s == one[20.0].predicted_s  # the median, not the slow first
    assert "| - | 61.0 (90.0/60.0/61.0) |" in sc.table(list(pts.values()))


def test_runs_are_sized_to_a_duration_and_averaging_to_whole_periods():
    """A run lasts about --run-s at the guessed step (at least --steps, at most
    MAX_RUN_STEPS); averaging's is a whole number of periods: it also averages at the last
    step, so a partial period would time an extra average."""
    ring = next(c for c in wc.cases(2, "mlp") if c.label == "sync ring")
    avg = next(c for c in wc.cases(2, "mlp") if c.setting["strategy"] == "average")
    assert avg.setting["period"] == wc.PERIOD == 8
    assert sc.run_steps(ring, 0.010, 20, 2.0) == 200
    assert sc.run_steps(ring, 0.5, 20, 2.0) == 20  # slow steps: --steps
    assert sc.run_steps(ring, 1e-6, 20, 2.0) == sc.MAX_RUN_STEPS
    assert sc.run_steps(avg, 0.010, 20, 2.0) == 200  # 25 periods
    assert sc.run_steps(avg, 0.5, 12, 2.0) == 16  # 12 steps would hold two averages
    assert sc.run_steps(avg, 0.015, 12, 2.0) == 136  # 134 rounded up to 17 periods
    # the guess: the profiled compute on the calibrated link, slower on a slower link
    fitted = cal.load(CAL)["fitted"]
    w = profile_model("mlp", wc.BATCH, repeats=1, input_shape=wc.INPUT["mlp"])
    fast = sc._predict("mlp", ring, 2, cal.link_for(fitted, 1000.0), w, w.step_compute_s, 2)
    slow = sc._predict("mlp", ring, 2, cal.link_for(fitted, 20.0), w, w.step_compute_s, 2)
    assert sc.run_steps(ring, fast, 20, 2.0) > sc.run_steps(ring, slow, 20, 2.0) >= 20


def test_the_parameter_server_s_points_come_from_the_event_simulation():
    """BSP at N = 3, 2 shards, a 100 Mbit/s link without a token bucket: the step is the
    event simulation's for the same setting. A shard's answers leave one after another
    there, so the first worker answered pushes again while the others' answers still
    leave: well under the fluid model's two phases (every push, then every answer), and
    no less than what one shard's receive side must take per step (3 pieces)."""
    from phalanx.scale.eventsim import AsyncSpec, simulate
    from phalanx.scale.network import Link, hosts_network
    from phalanx.scale.predict import predict, ps_bytes

    link = Link(bandwidth=100e6 / 8)
    w = profile_model("mlp", wc.BATCH, repeats=1, input_shape=wc.INPUT["mlp"])
    c = next(c for c in wc.cases(3, "mlp") if c.label == "bsp")
    got = sc._predict("mlp", c, 3, link, w, 0.003, cores=0)
    s, ww = wc.setting_of(c, 3), w.with_compute(0.003, "fitted")
    push, pull = ps_bytes(ww, s)
    assert got == simulate(AsyncSpec(
        workers=3, shards=2, steps=sc.SIM_STEPS, compute_s=0.003, push_bytes=push,
        pull_bytes=pull, worker_bw=link.bandwidth, shard_bw=link.bandwidth,
        server_msg_s=s.server_msg_s, server_byte_s=s.server_byte_s,
        consistency="bsp")).step_s
    assert got < 0.85 * predict(ww, s, hosts_network(3, link)).step_s
    assert got > 3 * (push / 2) / link.bandwidth
    # SSP's bound: the runs' and the prediction's the same
    ssp = next(c for c in wc.cases(3, "mlp") if c.label == "ssp")
    assert ssp.flags[-2:] == ("--staleness", "3") and ssp.setting["staleness"] == 3


def test_a_point_keeps_the_cut_its_runs_made(tmp_path):
    """The cut a model-parallel or pipeline run made (its summary's partition) comes back
    with ``--reuse``: from ``steps.json`` where it was kept, else from the run folders
    beside it; several runs of a point: the most common."""
    row = {"model": "mlp", "label": "model-parallel", "n": 3, "rate": 20.0,
           "measured_s": 0.02, "predicted_s": 0.02, "held_out": True}
    (tmp_path / "steps.json").write_text(json.dumps([row]))
    for name, part in (("mlp-n3-20-model-parallel-0", ["flatten", "fc1", "relu1,fc2,relu2,fc3"]),
                       ("mlp-n3-20-model-parallel-1", ["flatten,fc1", "relu1,fc2", "relu2,fc3"]),
                       ("mlp-n3-20-model-parallel-2", ["flatten,fc1", "relu1,fc2", "relu2,fc3"])):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "summary.json").write_text(json.dumps({"partition": part}))
    parts = sc.load_parts(tmp_path / "steps.json")
    key = ("mlp", "model-parallel", 3, 20.0)
    assert len(parts[key]) == 3
    assert sc._cut(parts[key]) == (("flatten", "fc1"), ("relu1", "fc2"), ("relu2", "fc3"))
    kept = {**row, "partition": [["flatten"], ["fc1"], ["relu1", "fc2", "relu2", "fc3"]]}
    (tmp_path / "steps.json").write_text(json.dumps([kept]))
    assert sc._cut(sc.load_parts(tmp_path / "steps.json")[key]) == (
        ("flatten",), ("fc1",), ("relu1", "fc2", "relu2", "fc3"))


def test_each_run_s_lost_segments_are_kept_and_split_the_table(capsys, tmp_path):
    """A run's hosts' RetransSegs and TCPTimeouts (hostgroup's netstats, one file a rank)
    are summed per run, kept in steps.json, read back by --reuse, and split the held-out
    points into runs without a retransmission timeout and runs that waited for one."""
    run = tmp_path / "run"
    run.mkdir()
    for r, (k, t) in enumerate(((3, 0), (4, 2))):
        (run / f"netstats-rank{r}.json").write_text(json.dumps(
            {"tx_bytes": 1e6, "retrans_segs": k, "tcp_timeouts": t, "mtu": 1500}))
    assert sc._resent(run, 2) == (7, 2)
    with pytest.raises(Exception, match="network counters"):
        sc._resent(run, 3)
    fitted = cal.load(CAL)["fitted"]
    found = {("mlp", "sync ring", 2, 1000.0): [0.060], ("mlp", "sync ring", 2, 20.0): [0.300],
             ("mlp", "sync ring", 3, 20.0): [0.400]}
    lost = {("mlp", "sync ring", 2, 20.0): [[5, 0]], ("mlp", "sync ring", 3, 20.0): [[7, 2]]}
    pts = sc.points(found, fitted, cores=8, resent_of=lost, tcp="reno")
    by = {(p.n, p.rate): p for p in pts}
    assert {p.tcp for p in pts} == {"reno"}  # the runs' congestion control, kept
    assert (by[2, 20.0].resent, by[2, 20.0].timeouts) == ((5,), (0,))
    assert (by[3, 20.0].resent, by[3, 20.0].timeouts) == ((7,), (2,))
    assert by[2, 1000.0].resent == by[2, 1000.0].timeouts == ()
    text = sc.table(pts)
    assert "| 7 (2) | held out |" in text
    assert "| of them, runs without a TCP retransmission timeout | 1 |" in text
    assert "| of them, runs that waited for one (>= 200 ms each) | 1 |" in text
    (tmp_path / "steps.json").write_text(json.dumps([p.__dict__ for p in pts]))
    assert sc.load_resent(tmp_path / "steps.json") == lost
    rc, _ = run_main(capsys, "scale", "steps", "--reuse", str(tmp_path / "steps.json"),
                     "--calibration", CAL, "--out", str(tmp_path / "again"))
    again = json.loads((tmp_path / "again" / "steps.json").read_text())
    assert rc == 0 and sorted(tuple(r["timeouts"]) for r in again) == [(), (0,), (2,)]
    assert {r["tcp"] for r in again} == {"reno"}  # --reuse: the runs', not this host's
    assert "TCP between the hosts: reno." in (tmp_path / "again" / "steps.md").read_text()
