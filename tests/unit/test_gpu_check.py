"""tools/gpu_check.sh without a GPU (docs/gpu.md): its dry run plans every strategy of the
registry with the settings each spec gives, checks each run as ``phalanx train`` would,
finds every file it needs, reports a missing data folder, and leaves at most the 8 files
the device tool brings back. Bad input is one line. The data is the test's own (small IDX
files and a text file), never Debian's."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from phalanx.data.idx import write_idx
from phalanx.models import MODELS
from phalanx.parallel.registry import NAMES, spec
from phalanx.runtime.hosts import unavailable

REPO = Path(__file__).resolve().parents[2]
STEPS = ["nvidia-smi", "env", "data", "pytest", "bench-gpu", "scaling-cuda", "scaling-cpu",
         "bench-gpt", "bench-ctr", "runs-lenet5", "runs-gpt", "runs-ctr", "scale"]
RUN_JOBS = 6  # tools/gpu_check.sh: strategy runs at once
RESULTS = {"SUMMARY.txt", "steps.json", "env.json", "runs.json", "benches.json",
           "logs.tar.gz"}


def make_data(root: Path) -> Path:
    """What tools/gpu_prepare.sh leaves: fashion-mnist/ IDX files and text/."""
    rng = np.random.default_rng(0)
    fm = root / "fashion-mnist"
    fm.mkdir(parents=True)
    for prefix, n in (("train", 128), ("t10k", 64)):
        write_idx(fm / f"{prefix}-images-idx3-ubyte.gz",
                  rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8))
        write_idx(fm / f"{prefix}-labels-idx1-ubyte.gz",
                  rng.integers(0, 10, size=n, dtype=np.uint8))
    words = ["the", "king", "of", "rome", "speaks", "and", "all", "the", "lords", "hear"]
    (root / "text").mkdir()
    (root / "text" / "tinyshakespeare.txt").write_text(
        "\n".join(" ".join(rng.choice(words, 12)) for _ in range(4000)) + "\n")
    return root


def gpu_check(tmp: Path, data: Path, cwd: Path = REPO, **env: str):
    full = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_")}
    full.update(OUT=str(tmp / "out"), GPU_CHECK_DATA=str(data), PYTHON=sys.executable,
                PYTHONPATH=str(REPO), **env)
    return subprocess.run(["bash", str(REPO / "tools" / "gpu_check.sh")], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpucheck")
    data = make_data(tmp / "data")
    r = gpu_check(tmp, data, GPU_CHECK_DRY="1")
    out = tmp / "out"
    return r, out, data


def test_dry_run_checks_every_step_and_passes(dry):
    r, out, _ = dry
    assert r.returncode == 0, r.stdout + r.stderr
    assert {p.name for p in out.iterdir()} == RESULTS  # <= 8 files: all come back
    steps = json.loads((out / "steps.json").read_text())
    assert steps["dry"] is True
    by_name = {s["name"]: s for s in steps["steps"]}
    assert [s["name"] for s in steps["steps"]] == STEPS
    for name in ("env", "data", "pytest", "bench-gpu", "scaling-cuda", "scaling-cpu",
                 "runs-lenet5"):
        assert by_name[name]["status"] == "ok", by_name[name]
    # the scale step runs only when named (minutes of its own): not in the default budget
    assert by_name["scale"]["status"] == "skipped" and by_name["scale"]["bound_s"] == 0
    assert by_name["scale"]["reason"].startswith("opt-in: name it in GPU_CHECK_STEPS")
    runs = json.loads((out / "runs.json").read_text())
    for model in ("gpt", "ctr"):
        step = by_name[f"runs-{model}"]
        if model in MODELS:  # every strategy planned; one may decline the model (refused)
            assert step["status"] == "ok", step
            assert [row["strategy"] for row in runs[model]["runs"]] == list(NAMES)
            assert {row["status"] for row in runs[model]["runs"]} <= {"ok", "refused",
                                                                     "skipped"}
        else:  # the model is not in this checkout (yet)
            assert step["status"] == "skipped" and f"model {model} is not" in step["reason"]
    for name in ("bench-gpt", "bench-ctr"):
        file = f"bench/{name.split('-')[1]}.py"
        expect = "ok" if (REPO / file).is_file() else "skipped"
        assert by_name[name]["status"] == expect, by_name[name]
        if expect == "skipped":
            assert by_name[name]["reason"] == f"{file} does not exist in this checkout"
    env = json.loads((out / "env.json").read_text())
    assert env["strategies"] == list(NAMES) and env["cores"] >= 1
    # whether the scale checks could run there (test hosts: root, ip, tc), as here
    assert env["test_hosts_unavailable"] == unavailable()
    summary = (out / "SUMMARY.txt").read_text()
    assert summary.startswith("phalanx gpu check") and "DRY RUN" in summary
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"logs/steps.tsv", "logs/pytest.log", "logs/runs-lenet5.json"} <= names


def test_dry_run_plans_every_strategy_with_its_spec(dry):
    _, out, data = dry
    table = json.loads((out / "runs.json").read_text())["lenet5"]
    assert table["strategies"] == list(NAMES) and table["dry"] is True
    assert table["jobs"] == RUN_JOBS  # checked through the pool: the table keeps the order
    assert [row["strategy"] for row in table["runs"]] == list(NAMES)
    assert table["data_dir"] == str(data / "fashion-mnist")
    for row in table["runs"]:
        s = spec(row["strategy"])
        words = row["command"].split()
        assert row["command"].startswith("python3 -m phalanx.cli train ")
        assert ["--strategy", s.name] == words[words.index("--strategy"):][:2]
        assert words[words.index("--device") + 1] == "cuda"
        for name, value in s.example.items():  # the spec's small settings, the case's model
            if name not in ("model", "data", "data_dir"):
                assert words[words.index("--" + name.replace("_", "-")) + 1] == str(value)
        assert words[words.index("--model") + 1] == "lenet5"
        if "workers" in s.unused:
            assert "--workers" not in words
        else:
            assert words[words.index("--workers") + 1] == str(s.fixed_workers or 2)
        if s.device.cuda and s.example.get("model", "lenet5") == "lenet5":
            assert row["status"] == "ok" and not row["reason"], row
        elif s.device.cuda:  # its example is another model's (tensor: the GPT's sizes)
            assert row["status"] == "refused" and "drop it" in row["reason"], row
        else:  # no CUDA path: skipped with the spec's own reason
            assert row["status"] == "skipped" and s.device.reason in row["reason"]


def test_the_opt_in_scale_step_checks_its_plan_when_named(tmp_path):
    """``GPU_CHECK_STEPS=scale``: tools/gpu_scale.py checks the calibration, the models and
    the sizes, and that test hosts can be made (here, as root: they can), and writes its
    plan to logs/scale.json; the summary says so. Nothing else runs."""
    r = gpu_check(tmp_path, tmp_path / "no-data", GPU_CHECK_DRY="1", GPU_CHECK_STEPS="scale")
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "out"
    steps = {s["name"]: s for s in json.loads((out / "steps.json").read_text())["steps"]}
    assert steps["scale"]["status"] == "ok", steps["scale"]
    assert {n for n, s in steps.items() if s["status"] != "skipped"} == {"scale"}
    with tarfile.open(out / "logs.tar.gz") as tar:
        plan = json.load(tar.extractfile("logs/scale.json"))
        log = tar.extractfile("logs/scale.log").read().decode()
    assert plan["dry"] is True and plan["steps"]["sizes"] == [2, 4, 8]
    assert plan["bytes"]["sizes"] == [8] and "test hosts can be made here" in log
    assert "scale (the simulator against runs at N up to 8" in (out / "SUMMARY.txt").read_text()


def test_dry_run_reports_a_missing_data_folder(tmp_path):
    missing = tmp_path / "no-data"
    r = gpu_check(tmp_path, missing, GPU_CHECK_DRY="1", GPU_CHECK_STEPS="data,runs-lenet5")
    assert r.returncode == 1, r.stdout + r.stderr
    steps = {s["name"]: s for s in json.loads((tmp_path / "out" / "steps.json").read_text())[
        "steps"]}
    assert steps["data"]["status"] == "failed"
    assert steps["data"]["reason"].startswith(f"data: {missing}: no such folder")
    assert steps["runs-lenet5"]["status"] == "failed"
    assert steps["env"]["status"] == "skipped"
    assert steps["env"]["reason"] == "not in GPU_CHECK_STEPS"
    table = json.loads((tmp_path / "out" / "runs.json").read_text())["lenet5"]
    assert f"{missing / 'fashion-mnist'}: no such directory" in table["error"]
    assert {row["status"] for row in table["runs"]} <= {"failed", "skipped"}
    assert "not ok: data, runs-lenet5" in (tmp_path / "out" / "SUMMARY.txt").read_text()


@pytest.mark.parametrize("case", ["outside-the-repo", "no-data", "unknown-step", "budget"])
def test_bad_input_is_one_line(tmp_path, case):
    data, cwd, env = tmp_path / "none", REPO, {}
    if case == "outside-the-repo":
        cwd = tmp_path
    elif case == "unknown-step":
        env = {"GPU_CHECK_STEPS": "env,bench-gpu2"}
    elif case == "budget":
        env = {"GPU_CHECK_BUDGET": "ten"}
    r = gpu_check(tmp_path, data, cwd=cwd, **env)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("gpu_check: ") and len(r.stderr.strip().splitlines()) == 1
    expected = {"outside-the-repo": "run it from the repository root",
                "no-data": f"{data}: no such folder",
                "unknown-step": "GPU_CHECK_STEPS: 'bench-gpu2' is not one of",
                "budget": "GPU_CHECK_BUDGET: 'ten'"}[case]
    assert expected in r.stderr
    assert not (tmp_path / "out").exists()  # nothing ran


def test_prepare_copies_the_data(tmp_path):
    source = make_data(tmp_path / "source")
    env = {**os.environ, "FASHION_MNIST_DIR": str(source / "fashion-mnist"),
           "SHAKESPEARE_FILE": str(source / "text" / "tinyshakespeare.txt")}
    dest = tmp_path / "prepared"
    r = subprocess.run(["bash", "tools/gpu_prepare.sh", str(dest)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for path in (source / "fashion-mnist").iterdir():
        assert (dest / "fashion-mnist" / path.name).read_bytes() == path.read_bytes()
    assert (dest / "text" / "tinyshakespeare.txt").is_file()
    env["FASHION_MNIST_DIR"] = str(tmp_path / "nothing")
    r = subprocess.run(["bash", "tools/gpu_prepare.sh", str(tmp_path / "again")], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "train-images-idx3-ubyte.gz: no such file" in r.stderr


def test_the_data_folder_is_ignored():
    # never committed: the device tool's carry sends it beside the checkout
    assert ".gpu-data/" in (REPO / ".gitignore").read_text().splitlines()


@pytest.fixture
def gpu_runs(monkeypatch):
    spec_ = importlib.util.spec_from_file_location("gpu_runs", REPO / "tools" / "gpu_runs.py")
    module = importlib.util.module_from_spec(spec_)
    monkeypatch.setitem(sys.modules, "gpu_runs", module)  # its dataclasses look it up
    spec_.loader.exec_module(module)
    return module


def test_runs_at_once_start_in_order_and_come_back_in_order(gpu_runs):
    """--jobs K: at most K at once, started in the registry's order as slots free up, the
    table in that order whatever order they finish in."""
    lock, running, peak, started = threading.Lock(), [0], [0], []

    def work(i: int) -> dict:
        with lock:
            started.append(i)
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.3 if i % 3 == 0 else 0.05)  # the first of each three is slow
        with lock:
            running[0] -= 1
        return {"i": i}

    items = list(range(10))
    t0 = time.monotonic()
    rows = gpu_runs.in_order(items, 3, work)
    wall = time.monotonic() - t0
    assert [r["i"] for r in rows] == items
    assert started[:3] == [0, 1, 2] and sorted(started) == items
    assert peak[0] == 3
    assert wall < 0.3 * 4 + 0.05 * 6  # the serial time: they overlapped
    started.clear()
    assert [r["i"] for r in gpu_runs.in_order(items, 1, work)] == items == started


def test_jobs_must_be_positive(gpu_runs, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        gpu_runs.main(["--model", "lenet5", "--data", str(tmp_path), "--out", str(tmp_path),
                       "--jobs", "0"])
    assert e.value.code == 2
    assert "--jobs: 0 must be >= 1" in capsys.readouterr().err


def test_a_run_is_bounded_and_its_figures_read(tmp_path, gpu_runs):
    """The runner's real path, on the CPU: a run's summary figures, and a run past its
    bound stopped (its whole process group) as a timeout."""
    run = gpu_runs.PlannedRun(strategy="sync", argv=(
        "--model", "mlp", "--data", "synthetic", "--strategy", "sync", "--workers", "2",
        "--max-steps", "4", "--batch-size", "32", "--train-limit", "512", "--test-limit",
        "256", "--no-progress", "--no-tensorboard"))
    row = gpu_runs.execute(run, tmp_path / "ok.log", 120)
    assert row["status"] == "ok" and row["rc"] == 0 and row["steps"] == 4, row
    assert row["samples_per_s"] > 0
    row = gpu_runs.execute(run, tmp_path / "slow.log", 0.5)
    assert row == {"rc": 124, "seconds": row["seconds"], "status": "timeout",
                   "reason": "past its 0.5 s bound"}
    assert row["seconds"] < 15
    # the runner told to stop (SIGTERM: the step's bound) stops a running run at once
    threading.Timer(1.0, gpu_runs.STOP.set).start()
    try:
        row = gpu_runs.execute(run, tmp_path / "stopped.log", 120)
    finally:
        gpu_runs.STOP.clear()
    assert row["status"] == "timeout" and row["rc"] == 124, row
    assert row["reason"] == "stopped with the runner (SIGTERM: the step's bound)"
    assert row["seconds"] < 10
