"""Training that diverges stops with one line naming the likely cause; a flag the chosen
strategy would ignore is refused, not dropped (issue 18, 'Also')."""

import pytest
import torch

from phalanx.cli import main
from phalanx.config import RunConfig
from phalanx.entry import api
from phalanx.parallel.divergence import Diverged, check_parameters


def test_nan_loss_stops_single_training_naming_the_lr(tmp_path):
    with pytest.raises(Diverged, match=r"training diverged: the training loss is nan .*--lr"):
        api.train("mlp", "synthetic", lr=1e5, max_steps=30, progress=False,
                  tensorboard=False, out=str(tmp_path / "run"))
    assert not (tmp_path / "run" / "summary.json").exists()


def test_non_finite_parameters_are_caught_for_any_strategy():
    cfg = RunConfig(lr=0.5)
    check_parameters(cfg, [torch.ones(3)])
    with pytest.raises(Diverged, match="NaN or infinite"):
        check_parameters(cfg, [torch.ones(3), torch.tensor([1.0, float("inf")])])


def run(capsys, *args):
    try:
        code = main(list(args))
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("flags,match", [
    (["--strategy", "asp", "--workers", "2", "--period", "4"], "--period: --strategy asp"),
    (["--strategy", "sync", "--workers", "2", "--staleness", "5"], "--staleness"),
    (["--strategy", "single", "--workers", "4"], "--workers: --strategy single"),
    (["--strategy", "asp", "--workers", "2", "--dc-lambda", "0.1"], "--dc-lambda"),
    (["--strategy", "sync", "--workers", "2", "--microbatches", "8"], "--microbatches"),
    (["--strategy", "average", "--workers", "2", "--bucket-mb", "1"], "--bucket-mb"),
])
def test_flag_the_strategy_ignores_is_refused(tmp_path, capsys, flags, match):
    code, err = run(capsys, "train", "--data", "synthetic", "--model", "mlp", *flags,
                    "--out", str(tmp_path / "run"))
    assert code == 2 and match in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def test_nan_loss_through_the_cli_is_exit_2_one_line(tmp_path, capsys):
    code, err = run(capsys, "train", "--data", "synthetic", "--model", "mlp", "--lr", "1e5",
                    "--max-steps", "20", "--no-progress", "--no-tensorboard", "--out",
                    str(tmp_path / "run"))
    assert code == 2 and err.startswith("phalanx: error: training diverged") and \
        err.count("\n") == 1
