"""Every strategy on CUDA with 2 ranks sharing one GPU (``--device cuda:0``: gloo through
pinned host buffers), compared with the same run on the CPU. Marked ``gpu``: skipped with
"CUDA not available" where there is none (tests/conftest.py).

After 20 steps sync / average / model-parallel / pipeline / hybrid equal the CPU run
within 1e-4; the parameter-server strategies and Hogwild! (whose interleavings differ from
run to run) learn.

Every run's keywords come from :func:`settings` (as tools/gpu_runs.py ``plan()``: 2 workers
unless the strategy's spec fixes the count, nothing the spec lists as unused), and
:func:`every_run` lists them all: tests/unit/test_gpu_test_settings.py checks each against
phalanx's own checks without a GPU. (The first GPU check, 2026-11-27, found ``workers=2``
given to pipeline, which refuses it: nothing had checked these settings without a GPU.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import phalanx
from phalanx.parallel.equivalence import max_state_diff
from phalanx.parallel.registry import spec

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
    # --precision bf16 (issue 47): CUDA's autocast, bf16 buckets / shards through the host
    "sync-bf16": {"strategy": "sync", "allreduce": "ring", "precision": "bf16"},
    "zero3-bf16": {"strategy": "zero", "zero_stage": 3, "precision": "bf16"},
}


LEARN_STEPS = 60
DATA_ON_DEVICE = ("yes", "no")
BASE = {"model": "mlp", "data": "synthetic", "batch_size": 32, "lr": 0.05, "rule": "sgd",
        "workers": 2, "max_steps": STEPS, "progress": False, "tensorboard": False,
        "eval_every": 10**6}
# the command lines of the one-line refusals below (after ``python -m phalanx.cli train``)
NCCL_SHARED = ["--model", "mlp", "--data", "synthetic", "--strategy", "sync", "--workers",
               "2", "--device", "cuda:0", "--backend", "nccl", "--no-progress"]


def settings(out: Path, name: str, device: str, **options) -> dict:
    """The keywords of ``phalanx.train`` for run ``name`` on ``device``: :data:`BASE`
    without what the strategy's spec lists as unused (pipeline and hybrid run
    --stages [x --replicas] processes, not --workers) and with the worker count the spec
    fixes, then ``options``."""
    s = spec(options.get("strategy", "single"))
    opts = {k: v for k, v in BASE.items() if k not in s.unused}
    if s.fixed_workers and "workers" in opts:
        opts["workers"] = s.fixed_workers
    return {**opts, "out": str(out / f"{name}-{device}"), "device": device, **options}


def equal_run(out: Path, name: str, device: str) -> dict:
    return settings(out, name, device, **EQUAL[name])


def learn_run(out: Path, name: str) -> dict:
    return settings(out, name, "cuda:0", **{**LEARN[name], "max_steps": LEARN_STEPS})


def data_run(out: Path, on_device: str) -> dict:
    if on_device == "cpu":  # the reference
        return settings(out, "data-cpu", "cpu", strategy="sync")
    return settings(out, f"data-{on_device}", "cuda:0", strategy="sync",
                    data_on_device=on_device)


def every_run(out: Path) -> dict[str, dict]:
    """Every ``phalanx.train`` call of this module: test id -> keywords."""
    runs = {f"equal-{n}-{d}": equal_run(out, n, d) for n in EQUAL for d in ("cuda:0", "cpu")}
    runs.update({f"learn-{n}": learn_run(out, n) for n in LEARN})
    runs.update({f"data-{d}": data_run(out, d) for d in (*DATA_ON_DEVICE, "cpu")})
    return runs


@pytest.mark.parametrize("name", EQUAL)
def test_cuda_run_equals_the_cpu_run(tmp_path, name):
    gpu = phalanx.train(**equal_run(tmp_path, name, "cuda:0"))
    cpu = phalanx.train(**equal_run(tmp_path, name, "cpu"))
    assert max_state_diff(gpu.model.state_dict(), cpu.model.state_dict()) <= 1e-4
    assert gpu.summary["steps"] == cpu.summary["steps"]


@pytest.mark.parametrize("name", LEARN)
def test_cuda_run_learns(tmp_path, name):
    r = phalanx.train(**learn_run(tmp_path, name))
    assert r.summary["test_accuracy"] > 0.3, r.summary  # chance is 0.1


@pytest.mark.parametrize("on_device", DATA_ON_DEVICE)
def test_data_on_device_does_not_change_the_run(tmp_path, on_device):
    a = phalanx.train(**data_run(tmp_path, on_device))
    b = phalanx.train(**data_run(tmp_path, "cpu"))
    assert max_state_diff(a.model.state_dict(), b.model.state_dict()) <= 1e-4


def test_nccl_for_ranks_sharing_a_gpu_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "phalanx.cli", "train", *NCCL_SHARED, "--out",
                        str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
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
