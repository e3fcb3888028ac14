"""``phalanx schedule --policy goodput``: a live sync job is resized by the learned goodput
policy from what it measured (1 -> 2 workers, then back to 1 when a second job arrives on
the 2-device cluster), continues from its checkpoint each time and finishes; the fitted
model is in the job's log and fits its measurements."""

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.runtime import rank_record

REPO = Path(__file__).resolve().parents[2]


def _two_jobs_under(tmp_path: Path, policy: str, strategy: str = "sync"
                    ) -> tuple[Path, str]:
    """``phalanx schedule --policy POLICY`` of e (160 epochs, from 0 s) and f (20 epochs,
    from 7 s), 1 GPU each asked, on 2 devices, rounds every 1.5 s: both finish; the run
    folder and e's log."""
    jobs = tmp_path / "jobs.yaml"
    sync = f"model: mlp, data: synthetic, strategy: {strategy}, tensorboard: false"
    jobs.write_text("jobs:\n"
                    f"  - {{name: e, arrival: 0, gpus: 1, config: {{{sync}, epochs: 160}}}}\n"
                    f"  - {{name: f, arrival: 7, gpus: 1, config: {{{sync}, epochs: 20}}}}\n")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "phalanx.cli", "schedule", "--jobs", str(jobs),
                        "--cluster", "uniform:1,1,1,2", "--policy", policy, "--interval",
                        "1.5", "--restart-cost", "1", "--out", str(out),
                        # goodput: each job starts on 1 device (nothing known of it), as
                        # under Pollux; at the default 4, e may start on both and stay
                        *(["--goodput-start", "1"] if policy == "goodput" else [])],
                       capture_output=True, text=True, cwd=REPO, timeout=240, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = list(csv.DictReader((out / "jobs.csv").open()))
    assert [x["status"] for x in rows] == ["finished", "finished"]
    return out, (out / "logs" / "e.log").read_text()


def test_goodput_resizes_a_live_job_from_its_own_measurements(tmp_path):
    # e grows to both devices (its first model knows no sync cost: 2 workers look twice as
    # fast). Whether it then gives one up to f is the policy's call: the power mean (p
    # -0.25) with a 50% minimum gain values e's second device (x1.6 measured) above
    # starting f, so f may wait for e; once e ends, f starts at once (the loop decides
    # again on an idle cluster: it once ended the schedule with f never started). On 2
    # shared cores a third rank only slows every rank (core_share), so e stops at 2.
    out, log = _two_jobs_under(tmp_path, "goodput")
    resized = re.findall(r"resized (\d+) -> (\d+) workers, batch (\d+) per worker, "
                         r"step (\d+) -> (\d+)", log)
    assert len(resized) >= 1, log
    sizes = [int(resized[0][0])] + [int(x[1]) for x in resized]
    assert sizes[:2] == [1, 2] and all(a != b for a, b in zip(sizes, sizes[1:])), sizes
    # each start resumed from the resized checkpoint at the converted step, with that many
    # ranks, each recording its own start
    events = [json.loads(ln) for ln in (out / "jobs" / "e" / "events.jsonl").read_text()
              .splitlines()]
    resumes = [e["step"] for e in events if e["kind"] == "resume" and e["rank"] == 0]
    assert resumes[:len(resized)] == [int(x[4]) for x in resized]
    recs = rank_record.read(out / "ranks" / "e.jsonl")
    for k, n in enumerate(sizes):
        assert sorted(x.rank for x in recs if x.start == k) == list(range(n))
    summary = json.loads((out / "jobs" / "e" / "summary.json").read_text())
    assert summary["steps"] > int(resized[-1][4]) and summary["test_accuracy"] > 0.5
    # the fitted model is printed after each new set-up (with its prediction there)...
    fits = re.findall(r"step-time model fitted to \[(.*?)\]: (alpha_c=\S+ .*? gamma=\S+); "
                      r"at .*? predicts (\S+) s/step, measured (\S+) ", log)
    assert len(fits) >= 2 and fits[-1][0].count("GPU") >= 2, log
    # ...and predicts the windows measured after it was fitted to their set-up (held out
    # in time) within 50% (median; one fit of 7 parameters to 2 set-ups can miss one of
    # them by more, which the log shows). Quiet, it is 2-10%; a loaded 2-core machine
    # (other tests, other processes) moves the later windows themselves by 30% (seen), so
    # the bound catches a model that is wrong (x2 and beyond), not a noisy neighbour. On a
    # machine loaded beyond twice its cores the windows themselves scatter further (59%
    # seen at load 9): there only a model wrong by far more than the noise fails
    held = re.search(r"against (\d+) later windows .*?: median \|error\| (\d+)%", log)
    bound = 50 if os.getloadavg()[0] <= 2 * (os.cpu_count() or 1) else 90
    assert held and int(held.group(1)) >= 3 and int(held.group(2)) <= bound, log


@pytest.mark.slow
def test_goodput_resizes_a_live_zero_job_through_its_hook(tmp_path):
    """The same schedule with zero-3 jobs: each resize goes through zero's own hook
    (``parallel/zero_resize.py``), each start re-cuts the shards the last one wrote for its
    own number of ranks (one run: e resized 1 -> 2 -> 1 workers, steps 310 -> 75 and
    125 -> 258, and finished; 39 s)."""
    out, log = _two_jobs_under(tmp_path, "goodput", strategy="zero, zero_stage: 3")
    resized = re.findall(r"resized (\d+) -> (\d+) workers, batch (\d+) per worker, "
                         r"step (\d+) -> (\d+)", log)
    assert resized and "not resized" not in log, log
    events = [json.loads(ln) for ln in (out / "jobs" / "e" / "events.jsonl").read_text()
              .splitlines()]
    resumes = [(e["step"], e["workers_saved"]) for e in events
               if e["kind"] == "resume" and e["rank"] == 0]
    assert resumes[:len(resized)] == [(int(x[4]), int(x[0])) for x in resized], resumes
    summary = json.loads((out / "jobs" / "e" / "summary.json").read_text())
    assert summary["steps"] > int(resized[-1][4]) and summary["test_accuracy"] > 0.5
    assert len(summary["held_bytes_per_rank"]) == int(resized[-1][1])


def test_pollux_resizes_a_live_job_from_its_own_measurements(tmp_path):
    """``--policy pollux`` (the simulator's PolluxPolicy, from the catalog: its model
    fitted to the set-ups a job ran, its genetic search) on real jobs: a job is resized
    after its model was fitted to what it measured, each start resumes from the resized
    checkpoint, and both jobs finish."""
    out, log = _two_jobs_under(tmp_path, "pollux")
    lines = log.splitlines()
    fitted = [i for i, ln in enumerate(lines) if "step-time model fitted to" in ln]
    resized = [(i, m) for i, ln in enumerate(lines)
               if (m := re.search(r"resized (\d+) -> (\d+) workers, batch (\d+) per worker, "
                                  r"step (\d+) -> (\d+)", ln))]
    # a resize decided once the job had measured itself (a model fitted before it)
    assert fitted and any(i > fitted[0] for i, _ in resized), log
    events = [json.loads(ln) for ln in (out / "jobs" / "e" / "events.jsonl").read_text()
              .splitlines()]
    resumes = [e["step"] for e in events if e["kind"] == "resume" and e["rank"] == 0]
    assert resumes[:len(resized)] == [int(m.group(5)) for _, m in resized]
    recs = rank_record.read(out / "ranks" / "e.jsonl")
    sizes = [1] + [int(m.group(2)) for _, m in resized]
    for k, n in enumerate(sizes):
        assert sorted(x.rank for x in recs if x.start == k) == list(range(n))
    summary = json.loads((out / "jobs" / "e" / "summary.json").read_text())
    assert summary["steps"] > int(resized[-1][1].group(5))


EPOCHS = 12


def test_goodput_resizes_a_live_parameter_server_job(tmp_path):
    """An asp job (1 shard) is resized in its workers from worker 0's own step times; it
    resumes at the common clock the resize chose each time and finishes its epochs."""
    jobs = tmp_path / "jobs.yaml"
    # 12 epochs: at 26k samples/s 6 could end inside the policy's first 1 s interval
    # (a fresh-clone run finished unresized, 1 of 2 runs alone failed)
    jobs.write_text("jobs:\n  - {name: p, arrival: 0, gpus: 1, config: {model: mlp, data: "
                    f"synthetic, epochs: {EPOCHS}, strategy: asp, servers: 1, checkpoint_every: "
                    "20, tensorboard: false}}\n")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "phalanx.cli", "schedule", "--jobs", str(jobs),
                        "--cluster", "uniform:1,1,1,4", "--policy", "goodput", "--interval",
                        "1", "--restart-cost", "1", "--out", str(out),
                        # started on 1 GPU (nothing is known of it), so that it must grow:
                        # at the default 4 it may start on the whole machine and stay
                        "--goodput-start", "1"],
                       capture_output=True, text=True, cwd=REPO, timeout=240, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not resized" not in r.stdout
    row = next(csv.DictReader((out / "jobs.csv").open()))
    assert row["status"] == "finished" and row["preemptible"] == "yes"
    log = (out / "logs" / "p.log").read_text()
    resized = re.findall(r"resized (\d+) -> (\d+) workers, batch (\d+) per worker, "
                         r"step (\d+) -> (\d+)", log)
    assert resized, log
    # the fitted model came from worker 0's perf events at the sizes it ran
    assert re.search(r"p: step-time model fitted to \[1 GPU x 1 node x batch 64", log), log
    run = out / "jobs" / "p"
    events = [json.loads(ln) for ln in (run / "events.jsonl").read_text().splitlines()]
    sizes = [int(resized[0][0])] + [int(x[1]) for x in resized]
    measured = {e["workers"] for e in events if e["kind"] == "perf"}
    assert sizes[0] == 1 and 1 in measured and measured <= set(sizes)
    # the starts (the driver's start event each): each resumed with the workers and at the
    # clock of a resize, in order (a start stopped while it started up may have logged no
    # start or no resume); the last start resumed every worker of the last resize
    starts: list[tuple[int, list[dict]]] = []
    for e in events:
        if e["kind"] == "start" and e["rank"] == -1:
            starts.append((e["workers"], []))
        elif e["kind"] == "resume" and e["role"] == "worker":
            starts[-1][1].append(e)
    assert starts[0] == (1, [])
    todo = [(int(n), int(step)) for _, n, _, _, step in resized]
    for workers, group in starts[1:]:
        while todo and not (todo[0][0] == workers
                            and {e["clock"] for e in group} <= {todo[0][1]}):
            todo.pop(0)
        assert todo, (workers, group, resized)
        assert {e["worker"] for e in group} <= set(range(workers))
        todo.pop(0)
    workers, group = starts[-1]
    assert workers == int(resized[-1][1]) and not todo
    assert sorted(e["worker"] for e in group) == list(range(workers))
    assert {e["clock"] for e in group} == {int(resized[-1][4])}
    cfg = json.loads((run / "config.json").read_text())
    assert (cfg["workers"], cfg["batch_size"]) == (int(resized[-1][1]), int(resized[-1][2]))
    summary = json.loads((run / "summary.json").read_text())
    per_epoch = 3968 // cfg["workers"] // cfg["batch_size"]     # synthetic: 3968 samples
    assert summary["steps"] == EPOCHS * per_epoch and summary["test_accuracy"] > 0.9
