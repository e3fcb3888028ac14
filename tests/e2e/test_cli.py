"""The CLI as a user runs it: a subprocess, real files, exit codes, one-line errors."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from cli_run import run_main

from phalanx.data.idx import write_idx


def phalanx(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "phalanx.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120)


def test_train_writes_contract_files(tmp_path):
    out = tmp_path / "run"
    r = phalanx("train", "--model", "mlp", "--data", "synthetic", "--epochs", "1",
                "--batch-size", "32", "--lr", "0.05", "--rule", "momentum", "--strategy",
                "single", "--workers", "1", "--seed", "2", "--out", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "test_accuracy" in r.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["test_accuracy"] > 0.4
    config = json.loads((out / "config.json").read_text())
    assert config["rule"] == "momentum" and config["seed"] == 2
    lines = (out / "events.jsonl").read_text().splitlines()
    assert all(json.loads(line)["kind"] for line in lines)


def test_config_file_and_override(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model: mlp\ndata: synthetic\nepochs: 1\nmax_steps: 5\nlr: 0.1\n")
    out = tmp_path / "run"
    r = phalanx("train", "--config", str(cfg), "--lr", "0.02", "--out", str(out),
                "--no-progress")
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "config.json").read_text())["lr"] == 0.02


def test_progress_lines_when_not_a_tty(tmp_path):
    r = phalanx("train", "--model", "mlp", "--data", "synthetic", "--epochs", "1",
                "--out", str(tmp_path))
    assert r.returncode == 0
    assert "single" in r.stderr and "%" in r.stderr


def test_bad_flag_in_a_real_process(tmp_path):
    r = phalanx("train", "--lr", "nan", "--out", str(tmp_path))
    assert r.returncode == 2
    expected = "phalanx: error: --lr: nan must be a finite number > 0"
    assert r.stderr.strip().splitlines() == [expected]


@pytest.mark.parametrize("args, needle", [
    (["--lr", "-1"], "--lr: -1.0 must be a finite number > 0"),
    (["--epochs", "abc"], "--epochs: invalid float value"),
    (["--strategy", "nope"], "--strategy: 'nope' is not one of"),
    (["--model", "vgg"], "--model: 'vgg' is not one of"),
    (["--rule", "lbfgs"], "--rule: 'lbfgs' is not one of"),
    (["--workers", "0"], "--workers: 0 must be in 1..256"),
    (["--slow-workers", "x"], "--slow-workers: 'x' is not RANK:FACTOR"),
    (["--data", "idx"], "--data idx: needs --data-dir"),
    (["--config", "/nonexistent.yaml"], "--config: /nonexistent.yaml: no such file"),
    (["--bogus-flag"], "unrecognized arguments: --bogus-flag"),
])
def test_bad_input_is_one_line_and_nonzero(tmp_path, capsys, args, needle):
    code, cap = run_main(capsys, "train", "--data", "synthetic", "--model", "mlp", "--out",
                         str(tmp_path), *args)
    assert code == 2
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("phalanx: error:"), cap.err
    assert needle in lines[0]


def test_corrupt_data_file_is_one_line(tmp_path, capsys):
    for prefix, n in (("train", 20), ("t10k", 10)):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte", np.zeros((n, 28, 28), np.uint8))
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte", np.zeros(n, np.uint8))
    bad = tmp_path / "train-images-idx3-ubyte"
    bad.write_bytes(bad.read_bytes()[:500])
    code, cap = run_main(capsys, "train", "--data", "idx", "--data-dir", str(tmp_path),
                         "--model", "mlp", "--out", str(tmp_path / "o"))
    assert code == 2
    assert cap.err.strip().count("\n") == 0 and "truncated" in cap.err
    assert not (tmp_path / "o" / "summary.json").exists()


def test_bad_config_file(tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"epochs": }')
    code, cap = run_main(capsys, "train", "--config", str(cfg))
    assert code == 2 and "not valid JSON/YAML" in cap.err
    cfg.write_text('{"epochz": 1}')
    code, cap = run_main(capsys, "train", "--config", str(cfg))
    assert code == 2 and "unknown setting 'epochz'" in cap.err


def test_models_lists_parameter_counts(capsys):
    code, cap = run_main(capsys, "models")
    assert code == 0
    assert "lenet5" in cap.out and "61,706" in cap.out
    # the text and click models at their defaults, on their own data's shapes
    assert "gpt             818,176" in cap.out and "ctr          27,293,039" in cap.out


@pytest.mark.parametrize("flags, line", [
    (["--device", "cuda", "--strategy", "sync", "--workers", "2"],
     "phalanx: error: --device cuda: no CUDA device is available on this machine"),
    (["--device", "cuda:7", "--strategy", "asp", "--workers", "2"],
     "phalanx: error: --device cuda:7: no CUDA device is available on this machine"),
    (["--device", "gpu"],
     "phalanx: error: --device: 'gpu' is not one of cpu, cuda, cuda:K"),
    (["--backend", "nccl", "--strategy", "sync", "--workers", "2"],
     "phalanx: error: --backend nccl: needs --device cuda (NCCL carries GPU tensors)"),
    (["--backend", "mpi"], "phalanx: error: --backend: 'mpi' is not one of auto, nccl, gloo"),
    (["--data-on-device", "maybe"],
     "phalanx: error: --data-on-device: 'maybe' is not one of auto, yes, no"),
    (["--worker-threads", "-1"], "phalanx: error: --worker-threads: -1 must be in 0..1024"),
])
def test_placement_errors_are_one_line(tmp_path, capsys, flags, line):
    # in-process (the entry point a real process runs: test_bad_flag_in_a_real_process)
    if torch.cuda.is_available() and "cuda" in " ".join(flags):
        pytest.skip("checks the CPU-only machine's message")
    code, cap = run_main(capsys, "train", "--model", "mlp", "--data", "synthetic",
                         "--max-steps", "2", "--out", str(tmp_path / "run"), "--no-progress",
                         *flags)
    assert code == 2
    assert cap.err.strip() == line and cap.out == ""
    assert not (tmp_path / "run" / "events.jsonl").exists()  # refused before anything ran


def test_a_run_that_ends_worse_than_it_started_exits_2_after_writing(tmp_path, capsys):
    """SGD at lr 4 for 3 steps: the test loss rises from the untrained model's 2.81 to ~200
    (finite: not a divergence). The results are written, the summary says so, and the
    command exits 2 with one line."""
    from phalanx.cli import main

    out = tmp_path / "run"
    code = main(["train", "--model", "mlp", "--data", "synthetic", "--rule", "sgd", "--lr",
                 "4", "--max-steps", "3", "--no-progress", "--no-tensorboard", "--out",
                 str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    summary = json.loads((out / "summary.json").read_text())
    assert code == 2 and summary["worse_than_start"] is True
    assert summary["test_loss"] > summary["initial_test_loss"] > 2.0
    # the synthetic test set is 1,000 samples: the comparison's samples are all of it
    assert summary["start_samples"] == 1000
    assert summary["start_samples_test_loss"] == summary["test_loss"]
    assert err == [f"phalanx: error: the run ended worse than it started: test loss "
                   f"{summary['initial_test_loss']:.4f} -> {summary['test_loss']:.4f} on the "
                   f"first 1000 test samples after 3 steps; a longer run or another --lr may "
                   f"train (results in {out})"]
