"""Pipeline parallelism (GPipe, 1F1B) with real processes equals single-process training,
over 2 epochs of 810 samples (not a multiple of the batch 32), one intra-op thread on both
sides (phalanx/parallel/equivalence.py)."""

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
            "worker_threads": 1, "strategy": "pipeline", "out": str(tmp_path / "run"),
            "progress": False, "tensorboard": False}
    base.update(kw)
    return base


@pytest.mark.parametrize(("schedule", "stages", "microbatches"),
                         [("gpipe", 3, 4), ("1f1b", 2, 4)])
def test_pipeline_equals_single_process(tmp_path, schedule, stages, microbatches):
    opts = _opts(tmp_path, pipeline_schedule=schedule, stages=stages, microbatches=microbatches)
    result = phalanx.train(**opts)
    ref = reference_training(make_job(RunConfig.from_mapping(opts).validate()), STEPS)
    assert result.summary["steps"] == STEPS
    assert max_state_diff(result.model.state_dict(), ref.state) <= 1e-5
    losses = logged_losses(result.history, rank=stages - 1)
    assert sorted(losses) == [1, 10, 20, 30, 40, 50]
    for step, loss in losses.items():
        assert loss == pytest.approx(ref.losses[step - 1], abs=1e-5)
    assert [e["step"] for e in result.history if e["kind"] == "eval"] == [25, 50]
    s = result.summary
    assert s["pipeline_schedule"] == schedule and len(s["partition"]) == stages
    # activations held per stage, measured: GPipe keeps all M, 1F1B at most P - stage
    live = s["stage_peak_live_microbatches"]
    if schedule == "gpipe":
        assert all(n in (0, microbatches) for n in live)
    else:
        assert all(n <= stages - i for i, n in enumerate(live))
    assert s["bytes_sent"] > 0


def test_pipeline_refuses_batchnorm_with_microbatches(tmp_path):
    opts = _opts(tmp_path, model="resnet", stages=2, microbatches=4)
    with pytest.raises(ConfigError, match="BatchNorm"):
        phalanx.train(**opts)


def test_pipeline_refuses_uneven_microbatches(tmp_path):
    with pytest.raises(ConfigError, match="microbatches: 5 does not divide batch_size=32"):
        phalanx.train(**_opts(tmp_path, microbatches=5))


def test_1f1b_needs_as_many_microbatches_as_stages(tmp_path):
    with pytest.raises(ConfigError, match="1f1b needs at least stages"):
        phalanx.train(**_opts(tmp_path, pipeline_schedule="1f1b", stages=3, microbatches=2))
