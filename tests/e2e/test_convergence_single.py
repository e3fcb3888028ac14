"""Convergence claims of the single-worker baseline on the real Fashion-MNIST (slow: run
with `pytest -m slow`; needs the Debian package dataset-fashion-mnist)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

FMNIST = Path("/usr/share/datasets/fashion-mnist")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not FMNIST.is_dir(), reason="dataset-fashion-mnist missing")]


def _train(tmp_path, *args):
    out = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "phalanx.cli", "train", "--data", "fashion-mnist",
                    "--out", str(out), "--no-progress", "--threads", "1", *args],
                   check=True, timeout=1800)
    return json.loads((out / "summary.json").read_text())


def test_lenet5_three_epochs_momentum(tmp_path):
    s = _train(tmp_path, "--model", "lenet5", "--epochs", "3", "--rule", "momentum")
    assert s["test_accuracy"] >= 0.88


def test_mlp_one_epoch(tmp_path):
    s = _train(tmp_path, "--model", "mlp", "--epochs", "1")
    assert s["test_accuracy"] >= 0.83
