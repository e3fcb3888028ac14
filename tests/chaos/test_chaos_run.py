"""The chaos harness with real processes: a short seeded run where every fault kind this
machine can inject occurs and no invariant is violated, and the checker catching each
bug planted in a copy of that run (a corrupt checkpoint, a temp file left, a job run twice
at once, a job lost, a resume that skipped the last checkpoint, final parameters not the
uninterrupted run's, an update applied twice, an unreadable state, a fault that does not
show, a process left). Both in one file: the run is made once (~35 s on two cores)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from phalanx.cluster.chaos.faults import Fault, plan
from phalanx.cluster.chaos.harness import RunResult, run
from phalanx.cluster.chaos.invariants import check
from phalanx.cluster.chaos.jobs import job_mix
from phalanx.cluster.chaos.options import ChaosOptions, default_kinds
from phalanx.cluster.chaos.view import RunView
from phalanx.cluster.chaos.watch import Seen, Watch
from phalanx.cluster.core.clusters import default_data_dir, resolve_cluster
from phalanx.cluster.live.joblist import load_job_list
from phalanx.cluster.live.state import STATE_FILE
from phalanx.runtime.checkpoint import load_checkpoint, save_checkpoint

# seven jobs (one of each kind), every fault kind this machine has, once
SHORT = {"seed": 5, "jobs": 7, "faults": 6, "window_s": 10.0}


@pytest.fixture(scope="module")
def short_run(tmp_path_factory) -> tuple[ChaosOptions, RunResult]:
    opts = ChaosOptions(out=Path(tmp_path_factory.mktemp("chaos")), kinds=default_kinds(),
                        **SHORT)
    (result,) = run(opts, say=lambda line: print(line, flush=True))
    return opts, result


def test_a_short_run_injects_every_kind_and_keeps_every_invariant(short_run) -> None:
    opts, r = short_run
    injected = {f.kind for f in r.faults if f.outcome == "injected"}
    assert injected == set(opts.kinds), [(f.kind, f.outcome) for f in r.faults]
    assert r.violations and all(not bad for bad in r.violations.values()), r.violations
    # the log on disk: one line per planned fault, each injected one with its time, the
    # scheduler's clock then (none before its first save) and its target
    rows = [json.loads(ln) for ln in
            (opts.out / f"seed-{opts.seed}" / "faults.jsonl").read_text().splitlines()]
    assert len(rows) == opts.faults
    for row in rows:
        if row["outcome"] == "injected":
            assert row["at"] >= row["planned"] and row["unix"] > 0 and row["target"], row
    print(f"chaos run {r.wall_s:.0f} s")


def _copy(opts: ChaosOptions, r: RunResult, dest: Path) -> RunView:
    """A copy of the short run as the checker sees it."""
    src = opts.out / f"seed-{opts.seed}"
    shutil.copytree(src, dest, symlinks=True)
    faults = [Fault(**json.loads(ln)) for ln in (dest / "faults.jsonl").read_text().splitlines()]
    refs = {p.name[len("ref-"):]: p
            for p in (opts.out / "references" / "schedule" / "jobs").iterdir()}
    return RunView(dest / "schedule", job_mix(opts.jobs, opts.seed), faults, Seen(loads=1),
                   refs, (dest / "scheduler.log").read_text(), dest / "tmp")


def _only(found: dict[str, list[str]], invariant: str, text: str, also: tuple = ()) -> None:
    """``invariant`` reports a violation saying ``text``; no other does (but ``also``)."""
    hit = {k: v for k, v in found.items() if v}
    assert set(hit) - set(also) == {invariant}, hit
    assert any(text in m for m in hit[invariant]), hit


def _events(view: RunView, job: str) -> Path:
    return view.out / "jobs" / job / "events.jsonl"


def test_the_checker_catches_every_planted_bug(short_run, tmp_path) -> None:
    opts, r = short_run
    jobs = job_mix(opts.jobs, opts.seed)
    sync = next(j.name for j in jobs if j.kind.name == "sync")
    ps = next(j.name for j in jobs if j.kind.ps)
    n = 0

    def fresh() -> RunView:
        nonlocal n
        n += 1
        return _copy(opts, r, tmp_path / f"copy{n}")

    v = fresh()
    assert not any(check(v).values()), check(v)     # the copy as it is: clean

    # a checkpoint cut short, and a temp file a crashed write left
    v = fresh()
    ckpt = v.out / "jobs" / sync / "checkpoint.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:-100])
    _only(check(v), "checkpoints whole", "checksum mismatch", also=("same as uninterrupted",))
    v = fresh()
    (v.out / "jobs" / sync / ".checkpoint.pt.tmp123").write_bytes(b"half")
    _only(check(v), "checkpoints whole", "left behind")

    # a resume from an older checkpoint: the final parameters are not the uninterrupted
    # run's (one value one ulp off), and the job's events show the skipped checkpoint
    v = fresh()
    payload = load_checkpoint(v.out / "jobs" / sync / "checkpoint.pt")
    first = next(iter(payload["model"]))
    payload["model"][first].view(-1)[0] = torch.nextafter(
        payload["model"][first].view(-1)[0], torch.tensor(1e9))
    save_checkpoint(v.out / "jobs" / sync / "checkpoint.pt", payload)
    _only(check(v), "same as uninterrupted", sync)
    v = fresh()
    with open(_events(v, sync), "a") as f:
        f.write(json.dumps({"kind": "checkpoint", "rank": 0, "role": "worker", "step": 180})
                + "\n" + json.dumps({"kind": "resume", "rank": 0, "role": "worker",
                                     "step": 160}) + "\n")
    _only(check(v), "resumes from the last checkpoint", "resumed at 160")

    # a parameter-server update applied twice
    v = fresh()
    lines = _events(v, ps).read_text().splitlines()
    apply = next(ln for ln in lines if '"kind": "apply"' in ln and '"role": "server"' in ln)
    _events(v, ps).write_text("\n".join([*lines, apply]) + "\n")
    _only(check(v), "updates applied once", "applied twice")

    # a job run twice at once, and a job lost (the scheduler's record of them)
    state_path = fresh().out / STATE_FILE
    v = RunView(state_path.parent, *_copy_args(tmp_path / f"copy{n}", opts, r))
    state = json.loads(state_path.read_text())
    fields = state["jobs"][sync]["fields"]
    fields["placements"] = [[0.0, [0, 1]], [1.0, [2, 3]]]
    fields["stops"] = [2.0, fields["end"]]
    state_path.write_text(json.dumps(state))
    _only(check(v), "never twice at once", "next start 1.00 s")
    del state["jobs"][sync]
    state_path.write_text(json.dumps(state))
    assert any(sync in m and "lost" in m for m in check(v)["every job ends once"])

    # the state file unreadable while the schedule runs: the watch sees it
    v = fresh()
    src = tmp_path / f"copy{n}"
    watch = Watch(v.out, jobs, load_job_list(src / "jobs.yaml"),
                  resolve_cluster("uniform:1,1,1,4", default_data_dir()), str(src))
    watch.look()
    (v.out / STATE_FILE).write_text('{"format": "phalanx-schedule-state", "vers')
    watch.look()
    assert watch.seen.loads == 1 and "corrupt (not JSON)" in watch.seen.bad_state[0]

    # a kill the scheduler never saw (at a time no start of the job spans)
    v = fresh()
    v.faults.append(Fault("kill-rank", 1.0, at=1.0, unix=time.time(), clock=1e6, job=sync,
                          target="rank 0 of start 0", pid=1, outcome="injected"))
    _only(check(v), "faults show", "no start of it spans that time")

    # a process of the run left behind
    v = fresh()
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)",
                          str(v.out / "jobs" / sync)])
    try:
        _only(check(v), "nothing left", "left running")
    finally:
        p.kill()
        p.wait()


def _copy_args(dest: Path, opts: ChaosOptions, r: RunResult) -> tuple:
    faults = [Fault(**json.loads(ln)) for ln in (dest / "faults.jsonl").read_text().splitlines()]
    refs = {p.name[len("ref-"):]: p
            for p in (opts.out / "references" / "schedule" / "jobs").iterdir()}
    return (job_mix(opts.jobs, opts.seed), faults, Seen(loads=1), refs,
            (dest / "scheduler.log").read_text(), dest / "tmp")


def test_the_plan_is_the_seeds() -> None:
    kinds = ("kill-rank", "stop-rank", "kill-scheduler")
    a, b = plan(3, 7, kinds, 20.0), plan(3, 7, kinds, 20.0)
    assert a == b and a != plan(4, 7, kinds, 20.0)
    assert {p.kind for p in a} == set(kinds) and len(a) == 7
    assert all(1.0 <= p.at <= 20.0 and 0 <= p.pick < 1 for p in a)
    assert [p.at for p in a] == sorted(p.at for p in a)


@pytest.mark.slow
def test_ten_seeds_of_twenty_faults_keep_every_invariant(tmp_path) -> None:
    """The long version (docs/faults.md quotes its table): 10 seeds x 20 faults, 24 jobs."""
    opts = ChaosOptions(out=tmp_path, seed=100, runs=10, faults=20, jobs=24,
                        kinds=default_kinds())
    results = run(opts)
    assert sum(f.outcome == "injected" for r in results for f in r.faults) >= 10 * 15
    bad = {r.seed: {k: v for k, v in r.violations.items() if v} for r in results}
    assert not any(bad.values()), bad
