"""Every strategy on CUDA with 2 ranks sharing one GPU (``--device cuda:0``: gloo through
pinned host buffers), compared with the same run on the CPU. Marked ``gpu``: skipped with
"CUDA not available" where there is none (tests/conftest.py).

After 20 steps sync / average / model-parallel / pipeline / hybrid equal the CPU run
within 1e-4; the parameter-server strategies and Hogwild! (whose interleavings differ from
run to run) learn.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import phalanx
from phalanx.parallel.equivalence import max_state_diff

pytestmark = pytest.mark.gpu

STEPS = 20
EQUAL = {
    "sync-ring": {"strategy": "sync", "allreduce": "ring"},
    "sync-native": {"strategy": "sync", "allreduce": "native"},
    "sync-main": {"strategy": "sync", "allreduce": "main"},
    "sync-sfb": {"strategy": "sync", "sfb": True},
    "average": {"strategy": "average", "period": 4},
    "model-parallel": {"strategy": "model-parallel"},
    "split-layer": {"strategy": "model-parallel", "split_layer": "fc1"},
    "pipeline-gpipe": {"strategy": "pipeline", "stages": 2, "microbatches": 4},
    "pipeline-1f1b": {"strategy": "pipeline", "stages": 2, "microbatches": 4,
                      "pipeline_schedule": "1f1b"},
    "hybrid": {"strategy": "hybrid", "stages": 2, "replicas": 1, "microbatches": 2},
}
LEARN = {
    **{s: {"strategy": s, "servers": 1} for s in
       ("bsp", "asp", "ssp", "softsync", "downpour", "dc-asgd")},
    "asp-pull-ahead": {"strategy": "asp", "servers": 1, "pull_ahead": True},
    "hogwild": {"strategy": "hogwild"},
    "hogwild-lock": {"strategy": "hogwild", "lock": True},
}


def _run(tmp_path, name: str, device: str, **options):
    opts = {"model": "mlp", "data": "synthetic", "batch_size": 32, "lr": 0.05, "rule": "sgd",
            "workers": 2, "max_steps": STEPS, "progress": False, "tensorboard": False,
            "eval_every": 10**6, "out": str(tmp_path / f"{name}-{device}"), "device": device}
    opts.update(options)
    return phalanx.train(**opts)


@pytest.mark.parametrize("name", EQUAL)
def test_cuda_run_equals_the_cpu_run(tmp_path, name):
    gpu = _run(tmp_path, name, "cuda:0", **EQUAL[name])
    cpu = _run(tmp_path, name, "cpu", **EQUAL[name])
    assert max_state_diff(gpu.model.state_dict(), cpu.model.state_dict()) <= 1e-4
    assert gpu.summary["steps"] == cpu.summary["steps"]


@pytest.mark.parametrize("name", LEARN)
def test_cuda_run_learns(tmp_path, name):
    r = _run(tmp_path, name, "cuda:0", **{**LEARN[name], "max_steps": 60})
    assert r.summary["test_accuracy"] > 0.3, r.summary  # chance is 0.1


@pytest.mark.parametrize("on_device", ["yes", "no"])
def test_data_on_device_does_not_change_the_run(tmp_path, on_device):
    a = _run(tmp_path, f"data-{on_device}", "cuda:0", strategy="sync",
             data_on_device=on_device)
    b = _run(tmp_path, "data-cpu", "cpu", strategy="sync")
    assert max_state_diff(a.model.state_dict(), b.model.state_dict()) <= 1e-4


def test_nccl_for_ranks_sharing_a_gpu_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "phalanx.cli", "train", "--model", "mlp",
                        "--data", "synthetic", "--strategy", "sync", "--workers", "2",
                        "--device", "cuda:0", "--backend", "nccl", "--out",
                        str(tmp_path / "run"), "--no-progress"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.startswith("phalanx: error: --backend nccl: 2 ranks would share a GPU")
    assert len(r.stderr.strip().splitlines()) == 1


def test_unknown_device_index_is_one_line(tmp_path):
    n = torch.cuda.device_count()
    r = subprocess.run([sys.executable, "-m", "phalanx.cli", "train", "--model", "mlp",
                        "--data", "synthetic", "--device", f"cuda:{n}", "--out",
                        str(tmp_path / "run"), "--no-progress"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip() == (f"phalanx: error: --device cuda:{n}: this machine has {n} "
                                f"CUDA device(s), cuda:0..cuda:{n - 1}")
