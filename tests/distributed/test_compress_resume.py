"""A compressed run killed and resumed ends where an uninterrupted compressed run ends (real
processes): the checkpoint carries each rank's error-feedback residuals, PowerSGD's
generator, step counts and warm-start Q (``Compression.state_tensors``). Without them the
resumed run drifts: error feedback would restart from zero and PowerSGD would redraw Q."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import phalanx
from phalanx.runtime.checkpoint import load_checkpoint
from phalanx.runtime.launch import WorkerFailed

STEPS = 16
FLAGS = {"model": "mlp", "data": "synthetic", "workers": 2, "batch_size": 16,
         "max_steps": STEPS, "rule": "momentum", "lr": 0.05, "test_limit": 100,
         "progress": False, "tensorboard": False}
CASES = {
    # start=2: plain steps first; warm: Q carried between steps; 1 + 2 buckets' residuals
    "sync-powersgd": {"strategy": "sync", "compress": "powersgd:1,start=2,warm",
                      "bucket_mb": 0.01},
    # the averaging round's delta (a string key), top-k with error feedback
    "average-topk": {"strategy": "average", "period": 2, "compress": "topk:0.05"},
}


def _diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("name", list(CASES))
def test_a_killed_compressed_run_resumes_to_the_uninterrupted_parameters(tmp_path: Path,
                                                                         name: str) -> None:
    extra = CASES[name]
    ref = phalanx.train(out=str(tmp_path / "ref"), **FLAGS, **extra).model.state_dict()
    run_dir = tmp_path / "run"
    with pytest.raises(WorkerFailed):
        phalanx.train(out=str(run_dir), checkpoint_every=8, kill_worker="1@8", **FLAGS,
                      **extra)
    saved = load_checkpoint(run_dir / "checkpoint.pt")
    assert saved["step"] == 8 and len(saved["comm"]) == 2
    # each rank's residuals are its own (they differ: each compressed its own gradient)
    residuals = [next(t for t in rank[3:] if t.is_floating_point()) for rank in saved["comm"]]
    assert residuals[0].abs().sum() > 0 and not torch.equal(residuals[0], residuals[1])
    result = phalanx.train(resume=str(run_dir))
    assert result.summary["steps"] == STEPS
    diff = _diff(result.model.state_dict(), ref)
    print(f"{name}: max |resumed - uninterrupted| = {diff:.1e}")
    assert diff == 0.0
