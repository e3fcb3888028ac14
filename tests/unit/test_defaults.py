"""Issue #25's defaults: each strategy's rule and lr when the user names neither, the
classifier's initial scale, and what phalanx compare hands each strategy."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from phalanx.config import RunConfig
from phalanx.experiments.compare import strategy_config
from phalanx.models import build_model
from phalanx.parallel.registry import NAMES, check_config


def checked(**values) -> RunConfig:
    return check_config(RunConfig.from_mapping(values))


@pytest.mark.parametrize("strategy, workers, rule, lr", [
    ("sync", 4, "momentum", 0.02), ("average", 4, "momentum", 0.02),
    ("bsp", 8, "momentum", 0.04), ("sync", 1, "sgd", 0.05),  # N = 1: single's own
    ("asp", 4, "sgd", 0.05), ("softsync", 4, "sgd", 0.05), ("dc-asgd", 4, "sgd", 0.05),
    ("hogwild", 4, "sgd", 0.05), ("model-parallel", 4, "sgd", 0.05), ("single", 1, "sgd", 0.05),
])
def test_each_strategy_s_default_rule(strategy, workers, rule, lr):
    cfg = checked(strategy=strategy, workers=workers)
    assert (cfg.rule, cfg.lr) == (rule, pytest.approx(lr, rel=1e-12))


def test_hybrid_scales_with_replicas_and_momentum_with_its_flag():
    assert (checked(strategy="hybrid", replicas=1).rule) == "sgd"
    cfg = checked(strategy="hybrid", replicas=2, stages=2)
    assert (cfg.rule, cfg.lr) == ("momentum", pytest.approx(0.01))
    cfg = checked(strategy="sync", workers=4, momentum=0.5)  # effective step 0.2 still
    assert cfg.lr / (1 - cfg.momentum) == pytest.approx(0.05 * 4)


def test_a_rule_or_lr_the_user_gives_is_kept():
    assert (checked(strategy="sync", workers=4, lr=0.1).rule,
            checked(strategy="sync", workers=4, lr=0.1).lr) == ("sgd", 0.1)
    cfg = checked(strategy="sync", workers=4, rule="adam")
    assert (cfg.rule, cfg.lr) == ("adam", 0.001)
    again = check_config(cfg)  # checking twice changes nothing
    assert (again.rule, again.lr) == ("adam", 0.001)


def test_compare_gives_each_strategy_its_own_unless_told(tmp_path: Path):
    # what `phalanx compare` builds: the settings as written (lr None: not chosen)
    base = RunConfig.from_mapping({"strategy": "single", "workers": 4})
    own = {s: strategy_config(base, s, tmp_path / s) for s in ("sync", "asp", "sandblaster")}
    assert (own["sync"].rule, own["sync"].lr) == ("momentum", pytest.approx(0.02))
    assert (own["asp"].rule, own["asp"].lr) == ("sgd", 0.05)
    assert own["sandblaster"].lr == 1.0 and own["sandblaster"].epochs == 100
    told = RunConfig.from_mapping({"strategy": "single", "workers": 4, "lr": 0.03})
    assert strategy_config(told, "sync", tmp_path / "t").lr == 0.03


def test_every_strategy_checks_at_its_defaults():
    for name in NAMES:
        cfg = checked(strategy=name, workers=2)
        assert cfg.lr > 0 and cfg.rule


def test_the_classifier_starts_at_gain_1_and_the_rest_at_he():
    torch.manual_seed(0)
    model = build_model("lenet5", (1, 28, 28), 10)
    fc2, fc3 = model.fc2.weight, model.fc3.weight  # fc2 feeds a ReLU; fc3 the softmax
    assert fc3.std().item() == pytest.approx(1 / math.sqrt(84), rel=0.1)
    assert fc2.std().item() == pytest.approx(math.sqrt(2 / 120), rel=0.1)
    assert model.fc3.bias.abs().max().item() == 0.0
