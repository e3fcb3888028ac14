"""Checkpoint / resume logic of sync and average, in one process (a real gloo group of one):
the data position after a skip, a resumed run equal to an uninterrupted one, and every
refusal of a checkpoint that does not belong to the run."""

from __future__ import annotations

import dataclasses
import itertools
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from phalanx.config import RunConfig
from phalanx.data import load_data
from phalanx.entry.api import make_job
from phalanx.errors import ConfigError
from phalanx.parallel import model_averaging, replicas, sync_dp
from phalanx.parallel.base import Job
from phalanx.parallel.dp_checkpoint import (
    checkpoint_path,
    read_checkpoint,
)
from phalanx.runtime.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

DATA = load_data("synthetic", None, 0)


@pytest.fixture
def group():
    """A real one-process gloo group (the strategies' collectives need one)."""
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


GPT = {"model": "gpt", "data": "shakespeare", "gpt_layers": 1, "gpt_dim": 16, "gpt_heads": 2,
       "context": 16}
CTR = {"model": "ctr", "data": "ctr-synthetic", "ctr_rows": 256, "ctr_dim": 4}


def _job(out: Path, **extra) -> Job:
    values = {"model": "mlp", "data": "synthetic", "strategy": "sync", "workers": 1,
              "batch_size": 32, "train_limit": 320, "epochs": 3, "lr": 0.05,
              "progress": False, "tensorboard": False, "test_limit": 100, "out": str(out),
              **extra}
    cfg = RunConfig(**values).validate()
    return make_job(cfg, cfg.model, DATA if cfg.data == "synthetic" else None)


def _train(job: Job) -> dict[str, torch.Tensor]:
    module = sync_dp if job.config.strategy == "sync" else model_averaging
    with replicas.open_log(job, 0) as log:
        model = module.train_worker(replicas.WorkerContext(job, 0, 1, log, time.perf_counter()))
    return {k: v.clone() for k, v in model.state_dict().items()}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_skip_continues_the_same_batch_sequence_across_epochs() -> None:
    job = _job(Path("/nonexistent"), batch_size=32)  # 10 micro-batches per epoch
    whole = list(itertools.islice(replicas.worker_batches(job, 0, 1), 35))
    for skip in (0, 3, 10, 27):
        resumed = list(itertools.islice(replicas.worker_batches(job, 0, 1, skip=skip),
                                        35 - skip))
        assert [e for e, _ in resumed] == [e for e, _ in whole[skip:]]
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(resumed, whole[skip:]))


class _Crash(Exception):
    pass


def _crash(log, role, rank, at, code):
    raise _Crash(f"{role} {rank} at {at} (exit {code})")


@pytest.mark.parametrize("strategy,extra", [
    ("sync", {"rule": "adam", "lr": 0.002, "augment": "flip,noise", "grad_accum": 2}),
    ("average", {"rule": "momentum", "lr": 0.02, "period": 2, "augment": "noise"}),
    # the GPT with AdamW, clipping and the warm-up + cosine schedule: its state comes back
    ("sync", {**GPT, "rule": "adamw", "lr": 0.003, "weight_decay": 0.1, "clip_grad_norm": 0.5,
              "schedule": "cosine", "warmup_steps": 3}),
    # the click model: its table's rows and their AdaGrad state (sparse) come back too
    ("sync", {**CTR, "rule": "adagrad", "lr": 0.05, "sparse_allreduce": True}),
])
def test_resume_after_a_crash_equals_the_uninterrupted_run(
        group, tmp_path: Path, monkeypatch, strategy: str, extra: dict) -> None:
    """Checkpoints every 4 steps, a crash after step 10 (in-process: the exit is replaced by
    an exception here; the real one is in tests/distributed/test_sync_faults.py), resume:
    the same parameters, bit for bit — the optimizer state, the augmentation's RNG and the
    data position all came back; steps 9-10 were computed twice."""
    from phalanx.parallel import dp_checkpoint

    full = _train(_job(tmp_path / "full", strategy=strategy, **extra))
    monkeypatch.setattr(dp_checkpoint, "die", _crash)
    first = _job(tmp_path / "run", strategy=strategy, checkpoint_every=4, kill_worker="0@10",
                 **extra)
    with pytest.raises(_Crash, match="worker 0 at step 10 \\(exit 4\\)"):
        _train(first)
    assert load_checkpoint(checkpoint_path(first.run_dir))["step"] == 8
    cont = _job(tmp_path / "run", strategy=strategy, checkpoint_every=4,
                resume=str(tmp_path / "run"), **extra)
    resumed = _train(cont)
    assert _max_diff(resumed, full) == 0.0
    assert load_checkpoint(checkpoint_path(cont.run_dir))["step"] == cont.planned_steps(320)


def test_fresh_run_deletes_a_stale_checkpoint(group, tmp_path: Path) -> None:
    stale = checkpoint_path(tmp_path / "run")
    save_checkpoint(stale, {"format": "phalanx-dp/1", "step": 999})
    job = _job(tmp_path / "run", max_steps=3)
    _train(job)
    assert load_checkpoint(stale)["step"] == 3  # the final checkpoint of this run


def test_a_checkpoint_of_another_run_is_refused(group, tmp_path: Path) -> None:
    job = _job(tmp_path / "run", max_steps=4, checkpoint_every=2)
    _train(job)
    cfg = job.config
    read_checkpoint(cfg)  # its own run: accepted
    other = dataclasses.replace(cfg, lr=0.1).validate()
    with pytest.raises(CheckpointError, match="--lr differs"):
        read_checkpoint(other)
    other = dataclasses.replace(cfg, workers=2).validate()
    with pytest.raises(CheckpointError, match="--workers 1, not --strategy sync --workers 2"):
        read_checkpoint(other)
    # settings that do not change the trajectory may differ
    read_checkpoint(dataclasses.replace(cfg, checkpoint_every=3, progress=True))

    path = checkpoint_path(cfg.out)
    blob = bytearray(path.read_bytes())
    blob[-5] ^= 0xFF
    path.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        read_checkpoint(cfg)
    save_checkpoint(path, {"step": 1, "model": {}})  # e.g. a single-worker checkpoint
    with pytest.raises(CheckpointError, match="not a sync / average checkpoint"):
        read_checkpoint(cfg)


def test_a_checkpoint_with_other_shapes_is_refused_in_the_worker(group, tmp_path: Path) -> None:
    job = _job(tmp_path / "run", max_steps=2)
    _train(job)
    path = checkpoint_path(job.run_dir)
    payload = load_checkpoint(path)
    payload["model"]["fc1.weight"] = torch.zeros(3, 3)
    save_checkpoint(path, payload)
    with pytest.raises(CheckpointError, match="parameters do not match this model"):
        _train(_job(tmp_path / "run", max_steps=2, resume=str(tmp_path / "run")))


def test_average_checkpoints_only_after_a_round() -> None:
    cfg = RunConfig(strategy="average", workers=2, period=4, checkpoint_every=6).validate()
    with pytest.raises(ConfigError, match="--checkpoint-every: 6 must be a multiple of "
                                          "--period 4"):
        model_averaging.check_config(cfg)
    model_averaging.check_config(RunConfig(strategy="average", workers=2, period=4,
                                           checkpoint_every=8).validate())
