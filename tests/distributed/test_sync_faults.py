"""Sync data parallel survives a killed worker (real processes).

* under ``torchrun --max-restarts 1`` worker 1 really dies (``os._exit(4)``) after step 12;
  torchrun restarts the group, which resumes from the checkpoint of step 10 and finishes:
  the final parameters equal an uninterrupted run's, and 2 steps were computed twice;
* with ``phalanx train`` (local spawn) the same kill ends the run with one line naming the
  killed worker; ``--resume DIR`` continues it to the uninterrupted run's parameters
  (a kill right after a checkpoint: nothing is computed twice) — for ``average`` too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import phalanx
from phalanx.metrics import read_events
from phalanx.runtime.checkpoint import load_checkpoint
from phalanx.runtime.launch import WorkerFailed

REPO = Path(__file__).resolve().parents[2]
STEPS, K = 20, 5
FLAGS = {"model": "mlp", "data": "synthetic", "workers": 2, "batch_size": 16,
         "max_steps": STEPS, "rule": "momentum", "lr": 0.02, "test_limit": 200,
         "progress": False, "tensorboard": False}


def _params(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir / "final_model.pt")["model"]


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, dict[str, torch.Tensor]]:
    """Uninterrupted runs (local spawn), one per strategy."""
    out = {}
    for strategy, extra in (("sync", {}), ("average", {"period": 2})):
        run_dir = tmp_path_factory.mktemp(f"ref-{strategy}")
        phalanx.train(strategy=strategy, out=str(run_dir), **FLAGS, **extra)
        out[strategy] = _params(run_dir)
    return out


def _cli_flags(values: dict) -> list[str]:
    return [a for k, v in values.items()
            for a in ((f"--{k.replace('_', '-')}",) if v is True
                      else (f"--no-{k.replace('_', '-')}",) if v is False
                      else (f"--{k.replace('_', '-')}", str(v)))]


def test_torchrun_restarts_a_killed_sync_worker_and_finishes(tmp_path: Path,
                                                             reference) -> None:
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--log-dir", str(tmp_path / "torchelastic"), "--nproc-per-node", "2",
           "--max-restarts", "1", "--monitor-interval", "0.2",
           "-m", "phalanx.entry.torchrun", "--strategy", "sync",
           *_cli_flags(FLAGS), "--checkpoint-every", str(K), "--kill-worker", "1@12",
           "--out", str(run_dir)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "phalanx: fault injection: worker 1 killed at step 12" in proc.stderr
    assert "phalanx: torchrun restart 1: resuming from the checkpoint" in proc.stderr

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["launcher"] == "torchrun"
    assert summary["train_samples"] == STEPS * 2 * 16
    events = read_events(run_dir / "events.jsonl")
    kinds = [e["kind"] for e in events]
    fault = next(e for e in events if e["kind"] == "fault")
    assert fault["worker"] == 1 and fault["at"] == "step 12"
    restart = next(e for e in events if e["kind"] == "restart")
    assert restart["attempt"] == 1 and restart["resume"] is True
    resumed = [e for e in events if e["kind"] == "resume"]
    assert sorted(e["rank"] for e in resumed) == [0, 1]
    assert {e["step"] for e in resumed} == {10}
    assert kinds.index("fault") < kinds.index("restart") < kinds.index("resume")
    checkpoints = [e["step"] for e in events if e["kind"] == "checkpoint"]
    assert checkpoints == [5, 10, 15, 20]  # 5, 10 before the crash; 15, 20 after
    # steps computed twice: the kill point minus the checkpoint resumed from (< K)
    recomputed = 12 - resumed[0]["step"]
    assert recomputed == 2
    diff = _max_diff(_params(run_dir), reference["sync"])
    print(f"torchrun restart: recomputed {recomputed} steps, max |resumed - uninterrupted| "
          f"= {diff:.1e}")
    assert diff <= 1e-6


@pytest.mark.parametrize("strategy,extra", [("sync", {}), ("average", {"period": 2})])
def test_local_kill_stops_with_one_line_and_resume_finishes(tmp_path: Path, reference,
                                                            strategy: str, extra: dict) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(WorkerFailed) as info:
        phalanx.train(strategy=strategy, out=str(run_dir), checkpoint_every=10,
                      kill_worker="1@10", **FLAGS, **extra)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("worker 1 was killed at step 10 (kill_worker)")
    assert f"phalanx train --resume {run_dir}" in message and "torchrun --max-restarts" in message
    assert load_checkpoint(run_dir / "checkpoint.pt")["step"] == 10

    result = phalanx.train(resume=str(run_dir))
    assert result.summary["steps"] == STEPS
    resumed = [e for e in result.events if e["kind"] == "resume"]
    assert {e["step"] for e in resumed} == {10}  # killed right after it: nothing redone
    diff = _max_diff(result.model.state_dict(), reference[strategy])
    print(f"{strategy}: kill after the checkpoint, --resume: max |diff| = {diff:.1e}")
    assert diff <= 1e-6


@pytest.fixture()
def small_disk(tmp_path: Path):
    """A 1.2 MB tmpfs: room for one checkpoint of FLAGS' model (~0.83 MB), not for the
    temp file of the next (real ENOSPC from the kernel, not a simulated one)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_disk_full_mid_checkpoint_keeps_the_previous_and_resume_finishes(small_disk: Path,
                                                                         reference) -> None:
    """The second checkpoint's write runs out of disk: the run stops with one line naming
    the folder, the first checkpoint stays whole (it loads, step 5) with no temp file
    beside it; once there is room, --resume finishes on the uninterrupted run's parameters."""
    run_dir = small_disk / "run"
    with pytest.raises(WorkerFailed) as info:
        phalanx.train(strategy="sync", out=str(run_dir), checkpoint_every=5, **FLAGS)
    message = str(info.value)
    assert "\n" not in message
    assert f"{run_dir}: cannot write checkpoint checkpoint.pt (No space left on device" \
        in message and "the previous one is kept whole" in message
    assert load_checkpoint(run_dir / "checkpoint.pt")["step"] == 5
    assert not [p.name for p in run_dir.iterdir() if ".tmp" in p.name]

    subprocess.run(["mount", "-o", "remount,size=8m", str(small_disk)], check=True)
    result = phalanx.train(resume=str(run_dir))
    assert result.summary["steps"] == STEPS
    assert {e["step"] for e in result.events if e["kind"] == "resume"} == {5}
    assert _max_diff(result.model.state_dict(), reference["sync"]) <= 1e-6
