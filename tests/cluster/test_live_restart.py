"""A restartable live scheduler (issue 33): ``phalanx schedule`` saves its state as it goes;
after ``kill -9`` of the scheduler, ``phalanx schedule --resume OUT`` continues the job list
with real processes on the local engine: finished jobs are not run again, the job that ran
resumes from its checkpoint and ends with the parameters of an uninterrupted run, and
nothing is left behind. Plus the state file's checks (one line, exit 2)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from live_procs import (
    Reference,
    alive,
    gone,
    pids_with,
    resumed,
    rows_of,
    wait_for_checkpoint,
)

from phalanx.cli import main
from phalanx.cluster.live.state import STATE_FILE
from phalanx.runtime import rank_record

REPO = Path(__file__).resolve().parents[2]
SYNC = ("{model: mlp, data: synthetic, epochs: 100, strategy: sync, tensorboard: false, "
        "seed: 3, worker_threads: 1")
# FIFO on 2 slots: F (a short 2-rank sync job) first, then S (the one killed mid-run: it
# checkpoints every 30 steps), then L (one slot) once S is done
S_LINE = (f"  - {{name: S, arrival: 0, gpus: 2, config: {SYNC}, max_steps: 300, "
          "checkpoint_every: 30}}")
JOBS = f"""jobs:
  - {{name: F, arrival: 0, gpus: 2, config: {SYNC}, max_steps: 10}}}}
{S_LINE}
  - {{name: L, arrival: 0, gpus: 1, config: {{model: mlp, data: synthetic, max_steps: 10,
      strategy: single, tensorboard: false}}}}
"""


def _env(tmp: Path) -> dict:
    # a private temp folder: whatever a run leaves in it is ours
    return {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp)}


def _schedule(jobs: Path, *args: str, env: dict, **kw):
    return [sys.executable, "-m", "phalanx.cli", "schedule", "--jobs", str(jobs),
            "--cluster", "uniform:1,1,1,2", *args], dict(env=env, cwd=REPO, text=True, **kw)


def test_kill_9_then_resume_finishes_every_job_as_if_uninterrupted(tmp_path, capsys):
    t_test = time.monotonic()
    temp = tmp_path / "temp"
    temp.mkdir()
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    out = tmp_path / "out"
    cmd, kw = _schedule(jobs, "--out", str(out), env=_env(temp))
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True, **kw)
    try:
        # kill the scheduler once S has written a checkpoint and still runs
        wait_for_checkpoint(out, "S", p)
        ranks = [r.pid for r in rank_record.read(out / "ranks" / "S.jsonl")]
        os.kill(p.pid, signal.SIGKILL)
        p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    state = json.loads((out / STATE_FILE).read_text())
    assert state["finished"] is False
    assert state["jobs"]["F"]["status"] == "done" and state["jobs"]["S"]["status"] == "running"
    assert state["pending"] == [] and state["queue"] == ["L"]
    # S's ranks died with their scheduler (PR_SET_PDEATHSIG): nothing to adopt
    assert gone(ranks), [Path(f"/proc/{q}/stat").read_text() for q in ranks if alive(q)]
    f_summary = (out / "jobs" / "F" / "summary.json").stat().st_mtime_ns

    # a fresh run into the same folder is refused; --resume with another list too
    other = tmp_path / "other.yaml"
    other.write_text(JOBS.replace("max_steps: 10}}", "max_steps: 11}}", 1))
    for args, text in (([jobs, "--out", out], "continue it with --resume"),
                       ([other, "--resume", out], "not the job list")):
        assert main(["schedule", "--jobs", *map(str, args)]) == 2
        err = capsys.readouterr().err
        assert text in err and err.count("\n") == 1, err

    # the uninterrupted reference runs beside the resumed schedule
    ref = Reference(tmp_path, S_LINE, "S", _env(temp))
    t0 = time.monotonic()
    cmd, kw = _schedule(jobs, "--resume", str(out), env=_env(temp))
    r = subprocess.run(cmd, capture_output=True, timeout=180, check=False, **kw)
    resumed_s = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    assert "S was running when the scheduler stopped" in r.stdout, r.stdout
    rows = rows_of(out)
    assert all(rows[n]["status"] == "finished" for n in "FSL"), rows
    # F ran once, before the kill: not again
    assert (out / "jobs" / "F" / "summary.json").stat().st_mtime_ns == f_summary
    assert {x.start for x in rank_record.read(out / "ranks" / "F.jsonl")} == {0}
    # S's second start (its second placement) resumed both ranks from a checkpoint
    assert len(rows["S"]["placements"].split(";")) == 2
    assert {x.start for x in rank_record.read(out / "ranks" / "S.jsonl")} == {0, 1}
    (r0, step0), (r1, step1) = resumed(out, "S")
    assert (r0, r1) == (0, 1) and step0 == step1 >= 30
    # the clock went on from the saved one
    assert float(rows["L"]["start"]) >= state["clock"]
    assert json.loads((out / STATE_FILE).read_text())["finished"] is True

    ref.assert_same_parameters(out)
    assert not pids_with(str(out)), "processes of the schedule left behind"
    assert not list(temp.iterdir()), f"temp files left behind: {list(temp.iterdir())}"
    # a finished schedule resumed again: nothing to do
    assert main(["schedule", "--jobs", str(jobs), "--cluster", "uniform:1,1,1,2", "--resume",
                 str(out)]) == 0
    assert "nothing to resume" in capsys.readouterr().out
    print(f"resumed schedule {resumed_s:.1f} s; whole test {time.monotonic() - t_test:.1f} s")


def test_resume_refuses_a_bad_state_in_one_line(tmp_path, capsys):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    out = tmp_path / "out"
    out.mkdir()
    state = out / STATE_FILE

    def refused(text: str) -> None:
        assert main(["schedule", "--jobs", str(jobs), "--cluster", "uniform:1,1,1,2",
                     "--resume", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("phalanx: error: ") and text in err and err.count("\n") == 1, err

    refused("no scheduler-state.json there")
    for text, why in (("{not json", "is corrupt (not JSON)"),
                      ("[1, 2]", "is not a phalanx schedule state"),
                      ('{"format": "phalanx-schedule-state", "version": 99}', "has version 99"),
                      ('{"format": "phalanx-schedule-state", "version": 1, "clock": 1}',
                       "missing or unknown fields"),
                      ("[" * 100000, "is corrupt (not JSON)")):
        state.write_text(text)
        refused(why)
    good = {"format": "phalanx-schedule-state", "version": 1, "jobs_digest": "x",
            "cluster": ["s0:2"], "clock": 1.0, "queue": [], "benched": [], "pending": [],
            "rejected": [], "jobs": {"F": {"status": "done", "gpus": "two", "fields": {},
                                           "folder": ""}},
            "series": {}, "events": 0, "finished": False}
    state.write_text(json.dumps(good))
    refused("a value of the wrong type")
    good["jobs"] = {}
    state.write_text(json.dumps(good))
    refused("not the job list")  # a state without "lost" (older) loads that far
    good["lost"] = [1]           # the lost servers are names
    state.write_text(json.dumps(good))
    refused("a value of the wrong type")
    good["lost"] = ["s0"]
    state.write_text(json.dumps(good))
    refused("not the job list")
    assert main(["schedule", "--jobs", str(jobs), "--resume", str(out), "--out",
                 str(tmp_path / "elsewhere")]) == 2
    assert "drop --out" in capsys.readouterr().err


def test_a_process_left_by_a_killed_scheduler_is_stopped_by_its_folder(tmp_path):
    """What --resume does with a process that outlived its scheduler (a ``phalanx train``
    driver of the local engine): found by the job's folder in its command line, SIGTERM to
    its process group (its children go too), SIGKILL once the grace is over."""
    from phalanx.cluster.live.restart import processes_of, stop_leftovers

    folder = tmp_path / "out" / "jobs" / "D"
    other = tmp_path / "out" / "jobs" / "DD"    # a name that only starts the same
    code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, "
            "signal.SIG_IGN); subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(60)']); time.sleep(60)")
    stubborn = subprocess.Popen([sys.executable, "-c", code, "--out", str(folder)],
                                start_new_session=True)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                  str(other)], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(
                [c for c in Path("/proc").iterdir() if c.name.isdigit() and _child_of(
                    int(c.name), stubborn.pid)]) < 1:
            time.sleep(0.05)
        child = next(int(c.name) for c in Path("/proc").iterdir()
                     if c.name.isdigit() and _child_of(int(c.name), stubborn.pid))
        assert processes_of(folder) == [stubborn.pid]
        t0 = time.monotonic()
        assert stop_leftovers([folder, other.with_name("E")], grace_s=0.5) == {"D": 1}
        took = time.monotonic() - t0
        stubborn.wait(timeout=5)
        assert stubborn.returncode == -signal.SIGKILL and 0.5 <= took < 5, took
        assert gone([child]) and bystander.poll() is None
    finally:
        for p in (stubborn, bystander):
            if p.poll() is None:
                p.kill()
                p.wait()


def _child_of(pid: int, parent: int) -> bool:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == parent
    except (OSError, IndexError, ValueError):
        return False
