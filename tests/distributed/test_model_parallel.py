"""Model parallelism with real processes equals single-process training."""

from __future__ import annotations

import pytest

import phalanx
from phalanx.config import RunConfig
from phalanx.entry.api import make_job
from phalanx.errors import ConfigError
from phalanx.parallel.equivalence import logged_losses, max_state_diff, reference_training

STEPS = 20


def _opts(tmp_path, **kw):
    base = {"model": "mlp", "data": "synthetic", "train_limit": 800, "test_limit": 200,
            "batch_size": 32, "max_steps": STEPS, "lr": 0.05, "rule": "momentum",
            "out": str(tmp_path / "run"), "progress": False, "tensorboard": False}
    base.update(kw)
    return base


def _reference(opts, replicas=1):
    cfg = RunConfig.from_mapping(opts).validate()
    return reference_training(make_job(cfg), STEPS, replicas)


@pytest.mark.parametrize("workers", [3])  # first, middle and last stage
def test_layer_parallel_equals_single_process(tmp_path, workers):
    opts = _opts(tmp_path, strategy="model-parallel", workers=workers)
    result = phalanx.train(**opts)
    ref = _reference(opts)
    assert result.summary["steps"] == STEPS
    assert max_state_diff(result.model.state_dict(), ref.state) <= 1e-5
    losses = logged_losses(result.history, rank=workers - 1)
    assert sorted(losses) == [1, 10, 20]
    for step, loss in losses.items():
        assert loss == pytest.approx(ref.losses[step - 1], abs=1e-5)
    s = result.summary
    assert s["stages"] == workers and len(s["partition"]) == workers
    assert s["bytes_sent"] > 0 and s["bytes_per_sample"] == pytest.approx(
        s["bytes_sent"] / s["train_samples"])
    evals = [e for e in result.history if e["kind"] == "eval"]
    assert evals and evals[-1]["rank"] == 0


def test_more_stages_than_layers_is_a_config_error(tmp_path):
    opts = _opts(tmp_path, strategy="model-parallel", workers=7, max_steps=2)
    with pytest.raises(ConfigError, match="7 stages but the model has only 6"):
        phalanx.train(**opts)


def test_split_layer_equals_single_process(tmp_path):
    # fc2 has 128 output features: uneven slices 43 + 43 + 42 over 3 workers
    opts = _opts(tmp_path, strategy="model-parallel", workers=3, split_layer="fc2")
    result = phalanx.train(**opts)
    ref = _reference(opts)
    assert max_state_diff(result.model.state_dict(), ref.state) <= 1e-5
    for step, loss in logged_losses(result.history, rank=0).items():
        assert loss == pytest.approx(ref.losses[step - 1], abs=1e-5)
    assert result.summary["split_bounds"] == [[0, 43], [43, 86], [86, 128]]
    assert result.summary["bytes_sent"] > 0


def test_split_layer_must_be_linear(tmp_path):
    opts = _opts(tmp_path, strategy="model-parallel", workers=2, split_layer="relu1")
    with pytest.raises(ConfigError, match="split_layer: 'relu1' is a ReLU"):
        phalanx.train(**opts)
