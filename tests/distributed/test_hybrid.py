"""Hybrid parallelism (replicated pipelines) with real processes equals single-process
large-batch training on the replicas' batches concatenated."""

from __future__ import annotations

import pytest

import phalanx
from phalanx.config import RunConfig
from phalanx.entry.api import make_job
from phalanx.parallel.equivalence import logged_losses, max_state_diff, reference_training

STEPS = 20


def test_two_replicas_of_two_stages_equal_single_process(tmp_path):
    opts = {"model": "mlp", "data": "synthetic", "train_limit": 1600, "test_limit": 200,
            "batch_size": 16, "microbatches": 2, "max_steps": STEPS, "lr": 0.05,
            "rule": "momentum", "strategy": "hybrid", "stages": 2, "replicas": 2,
            "pipeline_schedule": "1f1b", "out": str(tmp_path / "run"), "progress": False,
            "tensorboard": False}
    result = phalanx.train(**opts)
    ref = reference_training(make_job(RunConfig.from_mapping(opts).validate()), STEPS,
                             replicas=2)
    assert result.summary["steps"] == STEPS
    assert result.summary["train_samples"] == STEPS * 16 * 2
    assert max_state_diff(result.model.state_dict(), ref.state) <= 1e-5
    losses = logged_losses(result.history, rank=1)  # replica 0's last stage
    assert sorted(losses) == [1, 10, 20]
    for step, loss in losses.items():
        assert loss == pytest.approx(ref.losses[step - 1], abs=1e-5)
    assert len(result.summary["stage_idle_fraction"]) == 4
    # events' convention: a train event's samples are its rank's replica's own
    last = [e for e in result.history if e["kind"] == "train" and e["step"] == STEPS]
    assert [e["samples"] for e in last] == [STEPS * 16]
