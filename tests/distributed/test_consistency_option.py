"""``--consistency`` replaces a parameter-server preset's model, with real processes."""

from __future__ import annotations

import phalanx
from phalanx.cli import main

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


def test_bad_consistency_flags_are_one_line(tmp_path, capsys) -> None:
    """In-process, as ``phalanx train`` parses them (the real-process path of a bad flag:
    tests/e2e/test_cli.py::test_bad_flag_in_a_real_process)."""
    for args, message in (
            (["--strategy", "asp", "--consistency", "eventual"],
             "--consistency: 'eventual' is not one of bsp, asp, ssp, softsync"),
            (["--strategy", "sync", "--workers", "2", "--consistency", "ssp"],
             "--consistency: only the parameter-server strategies have a consistency model"),
            (["--strategy", "asp", "--workers", "2", "--staleness", "5"],
             "--staleness: consistency asp does not use it (only consistency ssp)")):
        code = main(["train", "--model", "mlp", "--data", "synthetic", *args, "--out",
                     str(tmp_path / "x")])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert err.startswith("phalanx: error: ") and message in err, err
        assert not (tmp_path / "x").exists()
