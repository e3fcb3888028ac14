"""``--consistency`` replaces a parameter-server preset's model, with real processes."""

from __future__ import annotations

import subprocess
import sys

import phalanx

BASE = {"model": "mlp", "data": "synthetic", "train_limit": 512, "test_limit": 256,
        "batch_size": 32, "max_steps": 12, "workers": 2, "progress": False,
        "tensorboard": False, "seed": 1}


def test_dc_asgd_runs_under_an_ssp_bound(tmp_path) -> None:
    s = phalanx.train(strategy="dc-asgd", consistency="ssp", staleness=0,
                      out=str(tmp_path / "dc-ssp"), **BASE).summary
    assert s["consistency"] == "ssp(0)"
    # SSP(0) with one push per step: a push is at most (workers - 1) updates old
    assert s["staleness_max"] <= BASE["workers"] - 1
    plain = phalanx.train(strategy="dc-asgd", out=str(tmp_path / "dc"), **BASE).summary
    assert plain["consistency"] == "asp"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phalanx.cli", "train", "--model", "mlp",
                           "--data", "synthetic", *args], capture_output=True, text=True,
                          timeout=120)


def test_bad_consistency_flags_are_one_line(tmp_path) -> None:
    for args, message in (
            (["--strategy", "asp", "--consistency", "eventual"],
             "--consistency: 'eventual' is not one of bsp, asp, ssp, softsync"),
            (["--strategy", "sync", "--workers", "2", "--consistency", "ssp"],
             "--consistency: only the parameter-server strategies have a consistency model"),
            (["--strategy", "asp", "--workers", "2", "--staleness", "5"],
             "--staleness: consistency asp does not use it (only consistency ssp)")):
        r = _cli(*args, "--out", str(tmp_path / "x"))
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith("phalanx: error: ") and message in r.stderr, r.stderr
