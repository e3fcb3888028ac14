"""Model parallelism with real processes equals single-process training, over 2 epochs of
a training set that is not a multiple of the batch (810 = 25 x 32 + 10: the second epoch
reshuffles, drops a different remainder and follows an evaluation that gathers the model),
with one intra-op thread on both sides (phalanx/parallel/equivalence.py says why)."""

from __future__ import annotations

import pytest

import phalanx
from phalanx.config import RunConfig
from phalanx.entry.api import make_job
from phalanx.errors import ConfigError
from phalanx.parallel.equivalence import logged_losses, max_state_diff, reference_training

STEPS = 50  # 2 epochs of 25 full batches (810 samples, batch 32)


def _opts(tmp_path, **kw):
    base = {"model": "mlp", "data": "synthetic", "train_limit": 810, "test_limit": 200,
            "batch_size": 32, "epochs": 2, "lr": 0.05, "rule": "momentum",
            "worker_threads": 1, "out": str(tmp_path / "run"), "progress": False,
            "tensorboard": False}
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
    assert sorted(losses) == [1, 10, 20, 30, 40, 50]
    for step, loss in losses.items():
        assert loss == pytest.approx(ref.losses[step - 1], abs=1e-5)
    assert ref.losses[-1] < ref.losses[0] - 0.5  # it learned: the comparison has teeth
    s = result.summary
    assert s["stages"] == workers and len(s["partition"]) == workers
    assert s["bytes_sent"] > 0 and s["bytes_per_sample"] == pytest.approx(
        s["bytes_sent"] / s["train_samples"])
    evals = [e for e in result.history if e["kind"] == "eval"]
    assert [(e["rank"], e["step"]) for e in evals] == [(0, 25), (0, 50)]  # each epoch's end


def test_more_stages_than_layers_is_a_config_error(tmp_path):
    opts = _opts(tmp_path, strategy="model-parallel", workers=7, epochs=1, max_steps=2)
    with pytest.raises(ConfigError, match="7 stages but the model has only 6"):
        phalanx.train(**opts)


def test_split_layer_equals_single_process(tmp_path):
    # fc2 has 128 output features: uneven slices 43 + 43 + 42 over 3 workers
    opts = _opts(tmp_path, strategy="model-parallel", workers=3, split_layer="fc2")
    result = phalanx.train(**opts)
    ref = _reference(opts)
    assert result.summary["steps"] == STEPS
    assert max_state_diff(result.model.state_dict(), ref.state) <= 1e-5
    losses = logged_losses(result.history, rank=0)
    assert sorted(losses) == [1, 10, 20, 30, 40, 50]
    for step, loss in losses.items():
        assert loss == pytest.approx(ref.losses[step - 1], abs=1e-5)
    assert result.summary["split_bounds"] == [[0, 43], [43, 86], [86, 128]]
    assert result.summary["bytes_sent"] > 0


def test_split_layer_must_be_linear(tmp_path):
    opts = _opts(tmp_path, strategy="model-parallel", workers=2, split_layer="relu1")
    with pytest.raises(ConfigError, match="split_layer: 'relu1' is a ReLU"):
        phalanx.train(**opts)
