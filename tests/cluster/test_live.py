"""Live mode with real processes: ``phalanx schedule`` runs real ``phalanx train`` jobs on 2
local slots with the simulator's policy objects; plus its input checks (in one process)."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from phalanx.cli import main
from phalanx.cluster.core.topology import uniform
from phalanx.cluster.live.config import LiveConfig
from phalanx.cluster.live.joblist import load_job_list
from phalanx.cluster.live.loop import LiveCluster
from phalanx.cluster.policies import Pack, make_ordering
from phalanx.errors import ConfigError, DataError
from phalanx.runtime import rank_record
from phalanx.runtime.preempt import PREEMPTED_EXIT

REPO = Path(__file__).resolve().parents[2]
TINY = "{model: mlp, data: synthetic, max_steps: 20, strategy: single, tensorboard: false}"
# the GPT as a job (issue 32): the live scheduler runs any workload phalanx train runs
TINY_GPT = ("{model: gpt, data: shakespeare, gpt_layers: 1, gpt_dim: 16, gpt_heads: 2, "
            "context: 16, train_limit: 2000, test_limit: 50, max_steps: 20, strategy: single, "
            "tensorboard: false}")


def truncated_idx(folder):
    """Gzipped IDX files whose headers and first images read well and whose training images'
    stream stops half-way: the list's check (the first samples) passes, the run's full read
    fails."""
    import numpy as np

    from phalanx.data.idx import write_idx

    folder.mkdir()
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 64), ("t10k", 16)):
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz",
                  rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz",
                  rng.integers(0, 10, n, dtype=np.uint8))
    images = folder / "train-images-idx3-ubyte.gz"
    images.write_bytes(images.read_bytes()[: images.stat().st_size // 2])
    return folder


def test_schedule_runs_real_jobs_on_two_slots(tmp_path):
    jobs, cut = tmp_path / "jobs.yaml", truncated_idx(tmp_path / "cut")
    jobs.write_text(f"""jobs:
  - {{name: a, arrival: 0, gpus: 1, config: {TINY}}}
  - {{name: b, arrival: 0, gpus: 1, config: {TINY}}}
  - {{name: bad, arrival: 0.1, gpus: 1, config: {{model: mlp, data: idx, data_dir: {cut}}}}}
  - {{name: c, arrival: 0.2, gpus: 1, config: {TINY_GPT}}}
""")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "phalanx.cli", "schedule", "--jobs", str(jobs),
                        "--cluster", "uniform:1,1,1,2", "--policy", "fifo", "--placement",
                        "pack", "--out", str(out)], capture_output=True, text=True, cwd=REPO,
                       timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    # settings are checked before any job starts (a gang larger than the cluster or a bad
    # value, a missing data folder refuses the list: tests/cluster/test_bad_input.py); what
    # only a run can find (here training images cut short after the first ones) fails that
    # job alone, recorded with its error line
    assert (s["jobs"], s["finished"], s["failed"], s["rejected"],
            s["rejected_oversize"]) == (4, 3, 1, 0, 0)
    rows = {row["name"]: row for row in csv.DictReader((out / "jobs.csv").open())}
    assert rows["bad"]["status"].startswith("failed: rank 0 exit 2: phalanx: error: "), rows["bad"]
    assert rows["bad"]["status"].endswith(" (after 1 restart)"), rows["bad"]
    assert "train-images-idx3-ubyte" in rows["bad"]["status"], rows["bad"]
    t = {n: (float(rows[n]["start"]), float(rows[n]["end"])) for n in ("a", "b", "bad", "c")}
    # FIFO on 2 slots: a and b at once; bad takes the first freed slot, c the second
    assert t["a"][0] < 1 and t["b"][0] < 1
    first_free, second_free = sorted([t["a"][1], t["b"][1]])
    assert first_free - 0.01 <= t["bad"][0] <= first_free + 1.0
    assert t["c"][0] >= min(second_free, t["bad"][1]) - 0.01
    # never more than 2 jobs at once, and never two on one slot (from the recorded times)
    slots = {n: rows[n]["placements"].split("@")[1] for n in t}
    for start, _ in t.values():
        live = [m for m, (s0, e0) in t.items() if s0 <= start < e0]
        assert len(live) <= 2 and len({slots[m] for m in live}) == len(live), live
    # each finished job is a real training run with its own outputs
    for n in ("a", "b", "c"):
        run = json.loads((out / "jobs" / n / "summary.json").read_text())
        assert run["steps"] == 20 and 0 <= run["test_accuracy"] <= 1
        assert ("test_perplexity" in run) == (n == "c")  # c is the GPT
        assert json.loads((out / "configs" / f"{n}.json").read_text())["max_steps"] == 20
    assert "bad" in r.stdout and "failed" in r.stdout


def test_job_list_errors(tmp_path):
    def bad(text, suffix=".yaml"):
        p = tmp_path / f"j{suffix}"
        p.write_text(text)
        with pytest.raises((DataError, ConfigError)) as e:
            load_job_list(p)
        return str(e.value)

    assert "jobs[0] (a): missing 'gpus'" in bad("jobs: [{name: a, arrival: 0}]")
    assert "gpus must be an integer >= 1" in bad("jobs: [{name: a, arrival: 0, gpus: 0}]")
    assert "arrival must be a number" in bad("jobs: [{name: a, arrival: soon, gpus: 1}]")
    assert "duplicate job name 'a'" in bad("jobs: [{name: a, arrival: 0, gpus: 1}, "
                                           "{name: a, arrival: 1, gpus: 1}]")
    assert "name must be" in bad("jobs: [{name: ../x, arrival: 0, gpus: 1}]")
    assert "config.lrr: unknown training setting" in bad(
        "jobs: [{name: a, arrival: 0, gpus: 1, config: {lrr: 1}}]")
    assert "config.workers: do not set it" in bad(
        "jobs: [{name: a, arrival: 0, gpus: 2, config: {workers: 2}}]")
    assert "invalid YAML" in bad("jobs: [")
    assert "expected a mapping with a 'jobs' list" in bad("- 1\n")
    assert "no jobs" in bad("jobs: []")
    assert "line 3: expected 4 fields" in bad("name,arrival,gpus,model\na,0,1,mlp\nb,0\n",
                                              ".csv")
    assert "expected header" in bad("a,b\n", ".csv")
    assert "expected a .yaml" in bad("x", ".txt")
    # a good CSV: settings as columns, empty cells keep defaults
    p = tmp_path / "ok.csv"
    p.write_text("name,arrival,gpus,duration,model,max_steps\nx,1.5,2,30,mlp,\ny,0,1,,,5\n")
    jobs = load_job_list(p)
    assert [j.spec.name for j in jobs] == ["y", "x"]        # by arrival
    assert jobs[1].spec.gpus == 2 and jobs[1].spec.duration == 30.0
    assert jobs[1].config == {"model": "mlp"} and jobs[0].config == {"max_steps": "5"}


def test_schedule_bad_flags_are_one_line(tmp_path, capsys, monkeypatch):
    jobs = tmp_path / "j.yaml"
    jobs.write_text("jobs: [{name: a, arrival: 0, gpus: 1}]\n")
    for args, text in ((["--policy", "lottery"], "unknown"),
                       (["--placement", "random"], "--placement random"),
                       (["--poll", "0"], "--poll must be"),
                       (["--grace", "0"], "--grace must be"),
                       (["--max-job-restarts", "-1"], "--max-job-restarts must be in [0, 1000]"),
                       (["--lost-wait", "-1"], "--lost-wait must be in [0, 604800]"),
                       (["--lost-wait", "nan"], "--lost-wait must be in [0, 604800]"),
                       (["--policy", "tiresias", "--tiresias-thresholds", "x"],
                        "not a comma list"),
                       (["--ray-address", "127.0.0.1:1"], "only with --engine ray"),
                       (["--jobs", str(tmp_path / "none.yaml")], "cannot read")):
        argv = ["schedule", "--jobs", str(jobs), "--out", str(tmp_path / "o"), *args]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert text in err and err.count("\n") == 1, (args, err)
    # without the optional extra, --engine ray names it (and leaves no temp folder)
    monkeypatch.setitem(sys.modules, "ray", None)
    before = set(Path("/tmp").glob("phalanx-ray-*"))
    assert main(["schedule", "--jobs", str(jobs), "--out", str(tmp_path / "o"),
                 "--engine", "ray"]) == 2
    err = capsys.readouterr().err
    assert "install the 'ray' extra" in err and err.count("\n") == 1
    assert set(Path("/tmp").glob("phalanx-ray-*")) == before


class FakeExecutor:
    """Jobs 'run' for ``polls`` polls; a stop ends them as preempted at the next poll."""

    name = "fake"

    def __init__(self, polls: int) -> None:
        self.polls, self.left, self.stopped, self.started = polls, {}, [], []
        self.failed = {}

    def start(self, gang):
        self.started.append((gang.job, gang.start, gang.argv))
        self.left[gang.job] = self.polls

    def poll(self, job):
        if self.left[job] == "stopped":
            del self.left[job]
            return PREEMPTED_EXIT
        self.left[job] -= 1
        if self.left[job] <= 0:
            del self.left[job]
            return 0
        return None

    def stop(self, job, grace_s):
        self.stopped.append(job)
        self.left[job] = "stopped"

    def close(self):
        self.left.clear()

    def down(self):
        return frozenset()

    def stop_leftovers(self, logs, grace_s):
        return {}


class LosingExecutor(FakeExecutor):
    """A FakeExecutor whose server ``lost`` is down from the first poll until ``back_after``
    polls have passed (never, with None)."""

    def __init__(self, polls: int, lost: str, back_after: int | None) -> None:
        super().__init__(polls)
        self.lost, self.back_after, self.polled = lost, back_after, 0

    def poll(self, job):
        self.polled += 1
        return super().poll(job)

    def down(self):
        self.polled += 1
        back = self.back_after is not None and self.polled > self.back_after
        return frozenset() if back else frozenset({self.lost})


@pytest.mark.parametrize("back_after", [60, None])
def test_a_job_only_lost_servers_hold_waits_for_them_then_fails(tmp_path, capsys, back_after):
    """Server s1 of two (1 device each) is lost from the start. ``one`` (1 device) runs on
    s0; ``both`` (2 devices) can only run once s1 is back: the loop waits for it rather than
    end with ``both`` never started. When s1 never comes back, ``both`` fails after
    --lost-wait with a line naming the server."""
    jobs = tmp_path / "j.yaml"
    cfg = "{model: mlp, data: synthetic, strategy: sync}"
    jobs.write_text(f"jobs:\n  - {{name: one, arrival: 0, gpus: 1, config: {cfg}}}\n"
                    f"  - {{name: both, arrival: 0, gpus: 2, config: {cfg}}}\n")
    topo = uniform(servers=2, devices=1, switches=1)
    ex = LosingExecutor(polls=5, lost=topo.servers[1].name, back_after=back_after)
    # the server comes back after 60 polls (0.3 s on an idle machine, seconds on a loaded
    # one): the wait for it must not run out first. Both at 0.3 s, a loaded suite run
    # failed 'both' with "lost for 0.3 s" in 2 of 3 runs (issue 52); never back, the
    # wait is short so that the failure comes fast
    lost_wait = 30.0 if back_after is not None else 0.3
    res = LiveCluster(topo, load_job_list(jobs), make_ordering("fifo", 0.0, (), 0.0), Pack(),
                      LiveConfig(tmp_path / "out", poll_s=0.005, lost_wait_s=lost_wait),
                      executor=ex).run()
    by = {st.spec.name: st for st in res.jobs}
    out = capsys.readouterr().out
    assert by["one"].end >= 0 and not by["one"].failure
    assert by["one"].placements[0][1] == (0,)
    assert "both wait(s) for lost server(s) " + topo.servers[1].name in out, out
    if back_after is not None:
        assert not by["both"].failure and by["both"].end > by["one"].end
        assert by["both"].placements[0][1] == (0, 1)
        assert f"server {topo.servers[1].name} is back" in out
    else:
        assert by["both"].start < 0 and by["both"].end >= 0.3
        assert by["both"].failure == (f"could not start: server(s) {topo.servers[1].name} "
                                      "lost for 0.3 s (--lost-wait)")
        state = json.loads((tmp_path / "out" / "scheduler-state.json").read_text())
        assert state["jobs"]["both"]["status"] == "done"
        assert state["lost"] == [topo.servers[1].name]  # what the dashboard draws lost


def test_rounds_never_stop_a_job_that_cannot_resume(tmp_path):
    """Tiresias rounds every poll on 2 slots: the model-parallel job (no resume) keeps its
    slot; the two sync jobs take turns on the other, each resume runs with --resume."""
    sync = "{model: mlp, data: synthetic, strategy: sync}"
    jobs = tmp_path / "j.yaml"
    jobs.write_text(f"""jobs:
  - {{name: pin, arrival: 0, gpus: 1, config: {{model: mlp, data: synthetic,
      strategy: model-parallel}}}}
  - {{name: p, arrival: 0, gpus: 1, config: {sync}}}
  - {{name: q, arrival: 0, gpus: 1, config: {sync}}}
""")
    ex = FakeExecutor(polls=40)
    live = LiveCluster(uniform(servers=1, devices=2), load_job_list(jobs),
                       make_ordering("tiresias", 0.02, (0.001,), 0.0), Pack(),
                       LiveConfig(tmp_path / "out", poll_s=0.005), executor=ex)
    res = live.run()
    by = {st.spec.name: st for st in res.jobs}
    assert all(st.end >= 0 and not st.failure for st in by.values())
    assert by["pin"].preemptions == 0 and "pin" not in ex.stopped
    assert by["pin"].spec.not_preemptible == "--strategy model-parallel cannot resume"
    assert by["p"].preemptions + by["q"].preemptions >= 2
    # the slot the pinned job holds is never given to anyone else while it runs
    pin_dev = by["pin"].placements[0][1]
    for n in "pq":
        assert all(d != pin_dev for _, d in by[n].placements if _ < by["pin"].end)
    # starts after a stop: a fresh start again (nothing on disk to resume here)
    assert len([s for s in ex.started if s[0] in "pq"]) == sum(
        by[n].preemptions + 1 for n in "pq")
    # each placement's stop, in order: after its start, before the next, the last the end
    for st in by.values():
        starts = [t for t, _ in st.placements]
        assert len(st.stops) == len(starts) and st.stops[-1] == st.end, (starts, st.stops)
        assert all(a <= b <= c for a, b, c in zip(starts, st.stops, starts[1:] + [st.end]))


def test_ctrl_c_mid_run_leaves_no_rank(tmp_path):
    """Local engine: SIGINT to the command's process group while a sync job's ranks run ->
    exit 130, and no process of the run is left (ranks run in their own sessions: the
    scheduler must stop them)."""
    jobs = tmp_path / "j.yaml"
    jobs.write_text("jobs: [{name: s, arrival: 0, gpus: 2, config: {model: mlp, data: "
                    "synthetic, epochs: 100, strategy: sync, tensorboard: false}}]\n")
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "phalanx.cli", "schedule", "--jobs", str(jobs),
                          "--cluster", "uniform:1,1,1,2", "--out", str(out)], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(rank_record.read(out / "ranks" / "s.jsonl")) < 2:
            time.sleep(0.1)
        pids = [r.pid for r in rank_record.read(out / "ranks" / "s.jsonl")]
        assert len(pids) == 2 and all(Path(f"/proc/{q}").exists() for q in pids)
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and "interrupted" in err, err
    assert not any(Path(f"/proc/{q}").exists() for q in pids)
