"""``phalanx interference profile`` (issue 49, item 2): real ``phalanx train`` jobs pinned
to one core time-share it, the window's arithmetic against a job whose rate is known, every
bad flag a line, and nothing left running — after a run, a job that died, a job that never
warmed up, or Ctrl-C of the profiler."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from phalanx import cli
from phalanx.cluster.model.interference import load_table
from phalanx.cluster.studies.interference import ProfileOptions, placement
from phalanx.cluster.studies.interference_jobs import (
    JobStart,
    ProfileError,
    WindowOptions,
    measure,
)
from phalanx.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
PAIR = "mlp-single-1:ctr-single-1"

# a stand-in for `phalanx train`: `train` events every 10 ms whose samples grow at exactly
# RATE per second (split over RANKS ranks), and where the job was allowed to run
FAKE = r"""
import json, os, sys, time
ranks, rate = int(sys.argv[1]), float(sys.argv[2])
out = sys.argv[sys.argv.index("--out") + 1]
os.makedirs(out, exist_ok=True)
open(os.path.join(out, "cores"), "w").write(repr(sorted(os.sched_getaffinity(0))))
t0, step = time.time(), 0
with open(os.path.join(out, "events.jsonl"), "a") as f:
    while True:
        time.sleep(0.01)
        step += 10
        now = time.time()
        for r in range(ranks):
            f.write(json.dumps({"kind": "train", "rank": r, "unix": now, "step": step,
                                "samples": rate / ranks * (now - t0)}) + "\n")
        f.flush()
"""


def marked(mark: str) -> list[int]:
    """Living processes whose environment carries ``mark`` (a job and all it started)."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            env = (p / "environ").read_bytes()
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if mark.encode() in env and state != "Z":
            found.append(int(p.name))
    return found


def none_left(mark: str, timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while marked(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    return marked(mark)


def start(name: str, argv: list[str], core: int, mark: str, ranks: int = 1) -> JobStart:
    return JobStart(name=name, argv=tuple(argv), core=core, ranks=ranks,
                    env=(("OMP_NUM_THREADS", "1"), ("PHALANX_TEST_MARK", mark)))


def window(seconds: float = 1.0, startup: float = 30.0) -> WindowOptions:
    return WindowOptions(seconds=seconds, warmup_steps=20, startup_timeout_s=startup,
                         grace_s=3.0)


def test_the_window_counts_a_known_rate_over_every_rank_on_the_pinned_core(tmp_path):
    mark = uuid.uuid4().hex
    core = sorted(os.sched_getaffinity(0))[-1]
    fake = [sys.executable, "-c", FAKE]
    rates = measure([start("one", [*fake, "1", "1000"], core, mark),
                     start("two", [*fake, "2", "3000"], core, mark, ranks=2)],
                    window(), tmp_path)
    assert rates == pytest.approx([1000, 3000], rel=0.02)
    for run in tmp_path.glob("*/run"):
        assert (run / "cores").read_text() == repr([core])
    assert none_left(mark) == []


def test_a_job_that_ends_early_or_never_warms_up_is_one_line_naming_it(tmp_path):
    mark = uuid.uuid4().hex
    died = [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"]
    with pytest.raises(ProfileError, match=r"^dies: the job ended \(exit 3\) before its "
                                           r"warm-up .*: boom$"):
        measure([start("dies", died, 0, mark)], window(), tmp_path / "a")
    idle = [sys.executable, "-c", "import time; print('waiting'); time.sleep(600)"]
    with pytest.raises(ProfileError, match=r"^idle: still no warm-up .* after 1.5 s"):
        measure([start("idle", idle, 0, mark)], window(startup=1.5), tmp_path / "b")
    assert none_left(mark) == []


def test_two_jobs_on_one_core_each_keep_about_half(tmp_path):
    """The real thing, small: mlp and ctr pinned to one core (level ``core``) time-share it.
    The suite runs beside other tests on 2 cores, whose processes may land on that core in
    one window and not the other: a result out of bounds is measured once more."""
    mark = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": str(REPO), "PHALANX_TEST_MARK": mark}
    seen = []
    for attempt in range(2):
        out = tmp_path / f"out{attempt}"
        r = subprocess.run([sys.executable, "-m", "phalanx", "interference", "profile",
                            "--pairs", PAIR, "--levels", "core", "--seconds", "2",
                            "--repeats", "1", "--out", str(out)],
                           capture_output=True, text=True, env=env, timeout=240)
        assert r.returncode == 0, r.stderr[-3000:]
        assert none_left(mark) == []
        progress = [x for x in r.stderr.splitlines() if x.startswith("[")]
        assert len(progress) == 3, r.stderr   # solo a, solo b, the pair
        table = load_table(out / "interference.json")
        assert set(table.classes) == {"mlp-single-1", "ctr-single-1"}
        assert all(c["solo"] > 0 for c in table.classes.values())
        (p,) = table.pairs
        assert (p.level, p.a, p.b, p.repeats) == ("core", "mlp-single-1", "ctr-single-1", 1)
        assert p.kept_a_ci == (round(p.kept_a, 4),) * 2
        assert "commit" in table.source and "load average" in table.source
        page = (out / "interference.md").read_text()
        assert "## Level `core`" in page and "Median |error|" in page
        seen.append((p.kept_a, p.kept_b))
        if 0.3 <= p.kept_a <= 0.75 and 0.3 <= p.kept_b <= 0.75 and \
                0.7 <= p.kept_a + p.kept_b <= 1.3:
            return
    pytest.fail(f"kept (mlp, ctr) out of [0.3, 0.75] each / sum [0.7, 1.3] twice: {seen}")


def test_ctrl_c_of_the_profiler_stops_its_jobs(tmp_path):
    mark = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": str(REPO), "PHALANX_TEST_MARK": mark}
    p = subprocess.Popen([sys.executable, "-m", "phalanx", "interference", "profile",
                          "--pairs", "mlp-single-1:mlp-single-1", "--levels", "core",
                          "--seconds", "60", "--out", str(tmp_path / "out")],
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("out")) or len(marked(mark)) < 2:
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.2)
        time.sleep(1.0)   # a job running (its fork of torch, maybe its window)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 128 + signal.SIGINT, err
    assert err.splitlines()[-1].startswith("phalanx: interrupted by SIGINT"), err
    assert none_left(mark) == []
    assert not (tmp_path / "out" / "interference.json").exists()


@pytest.mark.parametrize("argv, flag", [
    (["--seconds", "0"], "--seconds"), (["--seconds", "nan"], "--seconds"),
    (["--repeats", "0"], "--repeats"), (["--repeats", "x"], "--repeats"),
    (["--levels", "core,device"], "--levels"), (["--levels", ""], "--levels"),
    (["--levels", "core,core"], "--levels"), (["--classes", "nope"], "--classes"),
    (["--classes", "mlp-single-1,mlp-single-1"], "--classes"),
    (["--pairs", "mlp-single-1"], "--pairs"), (["--pairs", "mlp-single-1:nope"], "--pairs"),
    (["--classes", "mlp-single-1", "--pairs", "mlp-single-1:gpt-single-1"], "--pairs"),
    (["--pairs", "mlp-single-1:gpt-single-1,gpt-single-1:mlp-single-1"], "--pairs"),
    (["--warmup-steps", "5"], "--warmup-steps"), (["--grace", "-1"], "--grace"),
    (["--startup-timeout", "inf"], "--startup-timeout"),
])
def test_a_bad_flag_is_one_line_naming_it(argv, flag, capsys):
    try:
        rc = cli.main(["interference", "profile", *argv])
    except SystemExit as e:   # argparse's own (a value of the wrong type)
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith("phalanx: error: ") and flag in err, err
    if flag == "--classes" and "nope" in argv:
        assert "mlp-single-1, lenet5-single-1" in err   # the known ones listed


def test_out_that_is_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    rc = cli.main(["interference", "profile", "--levels", "core", "--out",
                   str(tmp_path / "f" / "x")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--out" in err, err


def test_levels_cores_and_the_plan():
    assert placement("core", [2, 5]) == (2, 2)
    assert placement("server", [2, 5]) == (2, 5)
    with pytest.raises(ConfigError, match="^--levels server: needs 2 cores"):
        placement("server", [3])
    opts = ProfileOptions(classes=("mlp-single-1", "ctr-single-1"), levels=("core",),
                          repeats=1)
    assert opts.pairs() == [("mlp-single-1", "mlp-single-1"), ("mlp-single-1", "ctr-single-1"),
                            ("ctr-single-1", "ctr-single-1")]
    assert opts.measurements() == 2 + 3 + 2
    full = ProfileOptions()
    assert len(full.classes) >= 6 and full.measurements() == 3 * 2 * (6 * 2 + 15 * 3)


def test_interference_help_imports_no_torch():
    check = ("import runpy, sys; sys.argv = ['phalanx', *sys.argv[1:]]\n"
             "try:\n    runpy.run_module('phalanx.cli', run_name='__main__')\n"
             "except SystemExit as e:\n    code = e.code\n"
             "sys.stderr.write(f'{code} {\"torch\" in sys.modules}\\n')")
    r = subprocess.run([sys.executable, "-c", check, "interference", "profile", "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.stderr.splitlines()[-1] == "0 False", r.stderr[-2000:]
