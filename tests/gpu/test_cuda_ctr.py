"""The click model (``--model ctr``, a sparse embedding table) on CUDA with 2 ranks sharing
one GPU: the parameter server (``asp``, 1 shard: the workers pull and push table rows) and
sync data parallel. Marked ``gpu``: skipped where CUDA
is not available (tests/conftest.py).

The first GPU check (2026-11-27) found the parameter-server worker's evaluation asking
for the host test set's table rows with the table on cuda:0 (a device mismatch in
``HashedFields.rows``): these runs evaluate during and after training.
"""

from __future__ import annotations

import pytest

import phalanx

pytestmark = pytest.mark.gpu

# small enough for a few seconds: 26 fields x 1,000 rows x 8 values
SMALL = {"ctr_rows": 1000, "ctr_dim": 8, "train_limit": 8000, "test_limit": 1500,
         "batch_size": 64, "progress": False, "tensorboard": False}
# (sync with --sparse-allreduce runs on CUDA in bench/ctr.py, the check's bench-ctr step)
RUNS = {
    "asp": {"strategy": "asp", "servers": 1},
    "sync": {"strategy": "sync"},
}


def settings(name: str, out: str) -> dict:
    """The keywords of ``phalanx.train`` for run ``name`` (also read by
    tests/unit/test_gpu_test_settings.py, which checks them without a GPU)."""
    return {"model": "ctr", "data": "ctr-synthetic", "workers": 2, "max_steps": 60,
            "eval_every": 30, "device": "cuda:0", "out": out, **SMALL, **RUNS[name]}


@pytest.mark.parametrize("name", RUNS)
def test_ctr_learns_and_evaluates_on_cuda(tmp_path, name):
    r = phalanx.train(**settings(name, str(tmp_path / name)))
    s = r.summary
    assert s["steps"] == 60, s
    # an evaluation during training (step 30) and the final one, each with its AUC
    evals = [e for e in r.events if e.get("kind") == "eval"]
    assert len(evals) >= 2 and all("test_auc" in e for e in evals), evals
    # learned: below the base rate's log-loss, the AUC above chance
    assert s["test_loss"] < s["data_base_logloss"] - 0.01, s
    assert s["test_auc"] > 0.6, s
