"""Hybrid parallelism (replicated pipelines) with real processes equals single-process
large-batch training on the replicas' batches concatenated, over 2 epochs of shards that
are not a multiple of the batch (1630 samples: 2 shards of 815 = 25 x 32 + 15)."""

from __future__ import annotations

import pytest

import phalanx
from phalanx.config import RunConfig
from phalanx.entry.api import make_job
from phalanx.parallel.equivalence import logged_losses, max_state_diff, reference_training

STEPS = 50  # 2 epochs of 25 batches per replica
BATCH = 32


def test_two_replicas_of_two_stages_equal_single_process(tmp_path):
    opts = {"model": "mlp", "data": "synthetic", "train_limit": 1630, "test_limit": 200,
            "batch_size": BATCH, "microbatches": 2, "epochs": 2, "lr": 0.05,
            "worker_threads": 1,
            "rule": "momentum", "strategy": "hybrid", "stages": 2, "replicas": 2,
            "pipeline_schedule": "1f1b", "out": str(tmp_path / "run"), "progress": False,
            "tensorboard": False}
    result = phalanx.train(**opts)
    ref = reference_training(make_job(RunConfig.from_mapping(opts).validate()), STEPS,
                             replicas=2)
    assert result.summary["steps"] == STEPS
    assert result.summary["train_samples"] == STEPS * BATCH * 2
    assert max_state_diff(result.model.state_dict(), ref.state) <= 1e-5
    losses = logged_losses(result.history, rank=1)  # replica 0's last stage
    assert sorted(losses) == [1, 10, 20, 30, 40, 50]
    for step, loss in losses.items():
        assert loss == pytest.approx(ref.losses[step - 1], abs=1e-5)
    assert len(result.summary["stage_idle_fraction"]) == 4
    # events' convention: a train event's samples are its rank's replica's own
    last = [e for e in result.history if e["kind"] == "train" and e["step"] == STEPS]
    assert [e["samples"] for e in last] == [STEPS * BATCH]
