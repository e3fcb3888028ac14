"""``phalanx chaos --engine ray``: the checks of its own faults and invariants on planted
runs (no processes, in the quick suite), a short seeded run on a real Ray cluster of three
test hosts where every Ray fault kind occurs and no invariant is violated, with the checker
catching what a fence that failed, an actor left or a loss never called would leave
(slow: ~60-90 s on two cores), and the long version."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from phalanx.cluster.chaos.faults import ENGINE_KINDS, Fault, plan
from phalanx.cluster.chaos.invariants import check, no_rank_on_a_fenced_host
from phalanx.cluster.chaos.jobs import job_mix, kinds_for
from phalanx.cluster.chaos.options import ChaosOptions, default_kinds, parse_kinds
from phalanx.cluster.chaos.shows import shows
from phalanx.cluster.chaos.view import RunView
from phalanx.cluster.chaos.watch import Seen
from phalanx.errors import ConfigError

DETAIL = {"host": 1, "server": "b", "fence_s": 3.75, "silent_s": [7.5, 8.0], "verdict_s": 11.0}


def _cut(unix: float, down_s: float) -> Fault:
    return Fault("cut-link", 5.0, at=5.0, unix=unix, clock=None, job="", target="host 1 (b)",
                 hold=down_s, outcome="injected",
                 detail={**DETAIL, "up_unix": unix + down_s})


def test_ray_options_refuse_what_ray_cannot_be_dealt_in_one_line() -> None:
    assert parse_kinds("all", "ray") == ENGINE_KINDS["ray"] == default_kinds("ray")
    assert "kill-fork-server" not in ENGINE_KINDS["ray"]
    with pytest.raises(ConfigError, match=r"^--kinds kill-fork-server: not a fault of "
                                          r"--engine ray \(its kinds: kill-rank"):
        parse_kinds("kill-rank,kill-fork-server", "ray")
    with pytest.raises(ConfigError, match="^--kinds crash-host, cut-link: not a fault of "
                                          "--engine local"):
        parse_kinds("crash-host,cut-link", "local")
    with pytest.raises(ConfigError, match="^--engine slurm: not an engine"):
        ChaosOptions(out=Path("x"), engine="slurm")
    with pytest.raises(ConfigError, match="not a fault kind of --engine local"):
        ChaosOptions(out=Path("x"), kinds=("cut-link",))
    # a crashed host's node is started again after 2-8 s; a link is down 1-14 s: below the
    # lease (3.75 s here), past it and past the verdict (8 s); the local plans are unchanged
    holds = [p for s in range(20) for p in plan(s, 20, ENGINE_KINDS["ray"], 60.0)]
    cuts = [p.hold for p in holds if p.kind == "cut-link"]
    assert all(2 <= p.hold <= 8 for p in holds if p.kind == "crash-host")
    assert min(cuts) < 3.75 and max(cuts) > 8.0 and all(1 <= h <= 14 for h in cuts)
    assert all(0.5 <= p.hold <= 3 for p in plan(3, 12, ENGINE_KINDS["local"], 20.0))
    # the sync kinds take one thread per rank on Ray (bit for bit the local reference)
    ray = {k.name: k for k in kinds_for("ray")}
    assert ray["sync"].config["worker_threads"] == 1 and "worker_threads" not in ray["asp"].config


def test_the_fence_check_sees_a_rank_on_a_cut_off_host() -> None:
    t = 1000.0
    seen = Seen(loads=1)
    # host 1 cut for 9 s: its rank 4242 seen 1 s and 4 s in (under the lease: allowed),
    # and 6.5 s in (past lease + slack: a rank that outlived its fence); host 2 untouched
    seen.on_host = [(t + 1.0, {1: [4242], 2: [77]}), (t + 4.0, {1: [4242]}),
                    (t + 6.5, {1: [4242], 2: [77]}), (t + 9.5, {1: [5000]})]
    v = RunView(Path("/nonexistent"), [], [_cut(t, 9.0)], seen)
    (msg,) = no_rank_on_a_fenced_host(v)
    assert "processes [4242]" in msg and "host 1" in msg, msg
    seen.on_host = seen.on_host[:2] + seen.on_host[3:]      # gone in time: kept
    assert no_rank_on_a_fenced_host(v) == []
    # a link back before the lease ran out: nothing had to go
    seen.on_host = [(t + 2.0, {1: [4242]})]
    v = RunView(Path("/nonexistent"), [], [_cut(t, 2.5)], seen)
    assert no_rank_on_a_fenced_host(v) == []


def test_a_host_loss_never_called_does_not_show(tmp_path: Path) -> None:
    """A crash (or a cut past the verdict) must be called lost by the scheduler, once per
    such fault; a short cut need not be."""
    state = {"jobs": {}}
    (tmp_path / "scheduler-state.json").write_text(json.dumps(state))
    crash = Fault("crash-host", 5.0, at=5.0, unix=100.0, job="", target="host 1 (b)",
                  hold=3.0, outcome="injected", detail=dict(DETAIL))
    v = RunView(tmp_path, [], [crash], Seen(loads=1), stdout="")
    (msg,) = shows(v, crash)
    assert "server b called lost 0 time(s), 1 expected" in msg
    v.stdout = "phalanx: scheduler: server b lost: its devices are out of service\n"
    assert shows(v, crash) == []
    long_cut, short_cut = _cut(200.0, 12.0), _cut(300.0, 2.0)
    v.faults += [long_cut, short_cut]
    assert "2 expected" in shows(v, long_cut)[0] and shows(v, short_cut) == []


def _ray_or_skip() -> None:
    from phalanx.cluster.chaos.raycluster import unavailable

    pytest.importorskip("ray")
    why = unavailable()
    if why is not None:
        pytest.skip(why)


@pytest.mark.slow
def test_a_short_ray_run_injects_every_ray_kind_and_keeps_every_invariant(tmp_path) -> None:
    """Seven jobs (one of each kind) and six faults (every Ray kind once) on a Ray cluster
    of three test hosts; then the checker on copies of that run, each with a planted bug."""
    _ray_or_skip()
    from phalanx.cluster.chaos.harness import run

    opts = ChaosOptions(out=tmp_path / "chaos", engine="ray", kinds=default_kinds("ray"),
                        seed=1, jobs=7, faults=6)
    t0 = time.monotonic()
    (r,) = run(opts, say=lambda line: print(line, flush=True))
    injected = {f.kind for f in r.faults if f.outcome == "injected"}
    assert injected == set(ENGINE_KINDS["ray"]), [(f.kind, f.outcome) for f in r.faults]
    assert r.violations and all(not bad for bad in r.violations.values()), r.violations
    rows = [json.loads(ln) for ln in
            (opts.out / "seed-1" / "faults.jsonl").read_text().splitlines()]
    by_kind = {row["kind"]: row for row in rows}
    crash, cut = by_kind["crash-host"], by_kind["cut-link"]
    assert crash["detail"]["host"] in (1, 2) and crash["detail"]["killed"] > 0
    assert crash["detail"]["node"] == "started again", crash
    assert cut["detail"]["up_unix"] >= cut["unix"] + cut["hold"] - 0.5, cut
    print(f"ray chaos run {r.wall_s:.0f} s, test {time.monotonic() - t0:.0f} s")

    # planted: the cut-off host kept a rank past its lease; an actor outlived the run; the
    # crash's loss was never called
    src = opts.out / "seed-1"
    dest = tmp_path / "copy"
    shutil.copytree(src, dest, symlinks=True)
    faults = [Fault(**json.loads(ln)) for ln in (dest / "faults.jsonl").read_text().splitlines()]
    refs = {p.name[len("ref-"):]: p
            for p in (opts.out / "references-ray" / "schedule" / "jobs").iterdir()}
    seen = Seen(loads=1)
    f = next(f for f in faults if f.kind == "cut-link")
    seen.on_host = [(f.unix + f.detail["fence_s"] + 2.5, {f.detail["host"]: [12345]})]
    stdout = (dest / "scheduler.log").read_text()
    v = RunView(dest / "schedule", job_mix(7, 1, kinds_for("ray")), faults, seen, refs,
                stdout.replace(" lost: ", " gone: "), dest / "tmp",
                left_on_hosts=["a device actor left running (host 2: pid 1)"])
    found = check(v)
    if f.detail["up_unix"] - f.unix > f.detail["fence_s"] + 2.5:
        assert found["no rank on a fenced host"], found
    assert found["nothing left"] == ["a device actor left running (host 2: pid 1)"], found
    assert any("called lost 0 time(s)" in m for m in found["faults show"]), found


@pytest.mark.slow
def test_ten_ray_seeds_of_twenty_faults_keep_every_invariant(tmp_path) -> None:
    """The long version on Ray (docs/faults.md quotes its table): 10 seeds x 20 faults,
    12 jobs each; every Ray kind several times."""
    _ray_or_skip()
    from phalanx.cluster.chaos.harness import run

    opts = ChaosOptions(out=tmp_path, engine="ray", seed=200, runs=10, faults=20, jobs=12,
                        kinds=default_kinds("ray"))
    results = run(opts)
    injected = [f.kind for r in results for f in r.faults if f.outcome == "injected"]
    assert all(injected.count(k) >= 5 for k in ENGINE_KINDS["ray"]), injected
    bad = {r.seed: {k: v for k, v in r.violations.items() if v} for r in results}
    assert not any(bad.values()), bad


def _state(path: Path, jobs: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "scheduler-state.json").write_text(json.dumps({"jobs": {
        name: {"status": "done", "fields": {"placements": p, "stops": s, "failure": "",
                                            "end": s[-1]}}
        for name, (p, s) in jobs.items()}}))


def test_a_job_that_finished_under_the_lease_or_before_the_crash_shows(tmp_path: Path) -> None:
    """A cut-off rank runs on until its lease is out: a short job may finish meanwhile
    (chaos seed 200: its summary 2.5 s after the cut, the lease 3.75 s), and a crash may
    hit a job whose summary was just written. Neither is a kill the scheduler must name;
    one that finished after its lease was out still is."""
    out = tmp_path / "schedule"
    _state(out, {"g": ([[10.0, [2]]], [28.0])})
    (out / "jobs" / "g").mkdir(parents=True)
    summary = out / "jobs" / "g" / "summary.json"
    summary.write_text("{}")
    now = summary.stat().st_mtime
    cut = _cut(now - 2.5, 8.4)
    cut.job, cut.clock = "g@0", 19.4
    v = RunView(out, [], [cut], Seen(loads=1), stdout="")
    assert shows(v, cut) == []
    cut.unix = now - 6.5      # the summary came after the lease + 2 s: the fence failed
    cut.detail["up_unix"] = cut.unix + 8.4
    assert "never named a failure" in shows(v, cut)[0]
    crash = Fault("crash-host", 5.0, at=5.0, unix=now + 0.2, clock=27.9, job="g@0",
                  target="host 2 (c)", hold=3.0, outcome="injected",
                  detail={**DETAIL, "host": 2, "server": "c"})
    v = RunView(out, [], [crash], Seen(loads=1),
                stdout="phalanx: scheduler: server c lost: its devices are out of service\n")
    assert shows(v, crash) == []


def test_a_kill_the_scheduler_died_before_naming_shows_at_its_resume(tmp_path: Path) -> None:
    """A shard killed 0.5 s before the scheduler was (chaos seed 200): the state it last
    saved had the job running, the resume ended that start at the saved clock and named
    the job as running when the scheduler stopped: the kill shows there."""
    out = tmp_path / "schedule"
    _state(out, {"asp": ([[10.25, [0, 1]], [15.02, [0, 1]]], [15.02, 18.2])})
    kill = Fault("kill-shard", 19.0, at=19.8, unix=1000.0, clock=15.4, job="asp",
                 target="shard 0", start=0, outcome="injected")
    sched = Fault("kill-scheduler", 20.0, at=20.3, unix=1000.5, clock=15.9, job="",
                  target="scheduler", outcome="injected")
    seen = Seen(loads=3)
    seen.clocks = [(999.0, 14.0, ("asp",)), (1000.0, 15.0, ("asp",)), (1002.0, 15.5, ("asp",))]
    said = "phalanx: scheduler: asp was running when the scheduler stopped; it resumes\n"
    v = RunView(out, [], [kill, sched], seen, stdout=said)
    assert shows(v, kill) == []
    v.stdout = ""             # the resume never named it
    assert "never named a failure" in shows(v, kill)[0]
    v.stdout, seen.clocks = said, [(1000.0, 15.0, ())]    # the save had it not running
    assert "never named a failure" in shows(v, kill)[0]


def test_a_start_the_watch_never_saw_does_not_misname_a_later_one(tmp_path: Path) -> None:
    """The watch numbers a driver's starts as it sees them; one that died within a look was
    never seen, so a later fault named start 4 where it hit start 5 (chaos seed 204: a
    crash at clock 34.0 s, start 4 had ended at 30.25 s). The clock names the start."""
    out = tmp_path / "schedule"
    times = [22.65, 22.74, 23.21, 23.73, 24.2, 31.21, 44.03]
    _state(out, {"g": ([[t, [2]] for t in times], [22.74, 23.21, 23.73, 24.2, 30.25, 43.41,
                                                    46.89])})
    crash = Fault("crash-host", 5.0, at=45.5, unix=100.0, clock=34.01, job="g@4",
                  target="host 2 (c)", hold=7.9, outcome="injected",
                  detail={**DETAIL, "host": 2, "server": "c"})
    said = ("phalanx: scheduler: server c lost: its devices are out of service; g will "
            "resume from a checkpoint\n")
    assert shows(RunView(out, [], [crash], Seen(loads=1), stdout=said), crash) == []
    crash.clock = 50.0        # no start spans it: the one named is checked, and fails
    (msg,) = shows(RunView(out, [], [crash], Seen(loads=1), stdout=said), crash)
    assert "start 4 ended at 30.25 s" in msg, msg
