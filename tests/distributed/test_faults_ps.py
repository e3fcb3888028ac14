"""Faults over real processes (gloo): a killed worker really exits and the run goes on
without it; a killed server shard really exits and ``--resume`` finishes the run from the
shards' checkpoints with at most K updates lost (measured); a lossy link loses pushes,
every loss is counted on both ends and the run finishes.

``slow``: the kill-1-of-4 comparison on Fashion-MNIST / LeNet-5.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist

import phalanx
from phalanx.config import RunConfig
from phalanx.entry.api import make_job
from phalanx.errors import PhalanxError
from phalanx.parallel import ps
from phalanx.parallel.base import Job, evaluate, read_result
from phalanx.runtime.launch import WorkerFailed, spawn

# with one server (rank 0), every other rank is a worker: a killed one (SIGKILL, as
# ps.run's launcher is told) leaves the run going
WORKERS = lambda rank: rank >= 1  # noqa: E731

FAST = {"model": "mlp", "data": "synthetic", "batch_size": 32, "lr": 0.1, "progress": False,
        "tensorboard": False, "ps_timeout": 4.0, "heartbeat_s": 0.3}


def make(tmp: Path, **options) -> Job:
    job = make_job(RunConfig.from_mapping({**FAST, "out": str(tmp), **options}).validate())
    job.run_dir.mkdir(parents=True, exist_ok=True)
    return job


def events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def _runs(rank: int, world: int, jobs: list[Job]) -> None:
    """Several runs in the same processes; only the last one may kill a process, so the
    barrier (a collective: it needs everybody) comes between the others only."""
    for i, job in enumerate(jobs):
        ps.process_main(rank, world, job)
        if i < len(jobs) - 1:
            dist.barrier()


def accuracy(job: Job) -> tuple[float, dict]:
    out = read_result(job)
    return evaluate(out.model, job.test)[1], out.stats


def test_asp_kill_one_of_four_workers_finishes_within_one_point(tmp_path):
    opts = {"strategy": "asp", "workers": 4, "servers": 1, "epochs": 2}
    clean = make(tmp_path / "clean", **opts)
    killed = make(tmp_path / "killed", **opts, kill_worker="2@20")
    spawn(_runs, 5, ([clean, killed],), survivable=WORKERS)
    acc_clean, s_clean = accuracy(clean)
    acc_killed, s_killed = accuracy(killed)
    print(f"asp 4 workers: fault-free {acc_clean:.4f}, worker 2 killed at step 20 "
          f"{acc_killed:.4f}")
    total = ps.steps_per_worker(clean)  # 62: two epochs of 1000 samples / 32
    assert s_clean["workers_lost"] == [] and s_clean["pushes_applied"] == 4 * total
    assert s_killed["workers_lost"] == [2]
    # the survivors finished every step; worker 2's pushes stop at its death (its last
    # pushes may die in flight with it: gloo sends asynchronously)
    assert 3 * total < s_killed["pushes_applied"] <= 3 * total + 20
    assert read_result(killed).steps == total
    assert abs(acc_killed - acc_clean) <= 0.01
    ev = events(killed.run_dir)
    (fault,) = [e for e in ev if e["kind"] == "fault"]
    (lost,) = [e for e in ev if e["kind"] == "worker_lost"]
    assert fault["rank"] == 1 + 2 and fault["worker"] == 2 and fault["at"] == "step 20"
    assert lost["worker"] == 2


def test_kill_server_then_resume_loses_at_most_k_updates(tmp_path):
    k, crash = 10, 25
    opts = {"strategy": "asp", "workers": 2, "servers": 2, "max_steps": 40,
            "checkpoint_every": k}
    with pytest.raises(PhalanxError, match="server 1 exited with code 3"):
        phalanx.train(out=str(tmp_path), kill_server=f"1@{crash}", **FAST, **opts)
    first = events(tmp_path)
    (fault,) = [e for e in first if e["kind"] == "fault"]
    assert fault["at"] == f"update {crash}"
    # the last update each shard applied before the crash (shard 0 was stopped by the
    # launcher somewhere after its own last checkpoint)
    applied = {s: 1 + max(e["version"] for e in first if e["kind"] == "apply"
                          and e["shard"] == s) for s in (0, 1)}
    assert applied[1] == crash

    result = phalanx.train(resume=str(tmp_path))
    ev = events(tmp_path)[len(first):]
    restored = {e["shard"]: e for e in ev if e["kind"] == "resume" and e["role"] == "server"}
    lost = {s: applied[s] - restored[s]["version"] for s in (0, 1)}
    print(f"kill shard 1 at update {crash}, checkpoint every {k}: updates lost per shard "
          f"{lost} (at most {k})")
    assert lost[1] == crash % k and all(0 <= n <= k for n in lost.values())
    # the workers continued from the clocks the shards restored, not from zero
    clocks = {e["worker"]: e["clock"] for e in ev if e["kind"] == "resume"
              and e["role"] == "worker"}
    assert clocks == {w: min(restored[s]["clocks"][w] for s in (0, 1)) for w in (0, 1)}
    assert all(c > 0 for c in clocks.values())
    s = result.summary
    # every one of the 2 x 40 pushes is in the final model exactly once per shard: the
    # ones the crash lost were redone, the ones a shard still had were ignored by seq
    assert s["steps"] == 40 and s["server_updates"] == 80 and s["pushes_applied"] == 160
    assert s["pushes_lost"] == 0 and s["test_accuracy"] > 0.5


def test_lossy_link_and_bsp_worker_loss(tmp_path):
    """1 server + 3 workers: BSP and ASP with 10% of pushes dropped, then BSP with a
    worker killed (--on-worker-loss continue)."""
    opts = {"workers": 3, "servers": 1, "max_steps": 30}
    bsp = make(tmp_path / "bsp", strategy="bsp", drop_messages=0.1, **opts)
    asp = make(tmp_path / "asp", strategy="asp", drop_messages=0.1, **opts)
    killed = make(tmp_path / "killed", strategy="bsp", kill_worker="1@10", **opts)
    spawn(_runs, 4, ([bsp, asp, killed],), survivable=WORKERS)
    for job in (bsp, asp):
        acc, s = accuracy(job)
        print(job.config.strategy, "drop 0.1:", {k: s[k] for k in ("pushes_dropped",
                                                                   "pushes_lost",
                                                                   "pushes_applied")}, acc)
        # every dropped push was detected by the shard's sequence numbers, no more
        assert s["pushes_dropped"] == s["pushes_lost"] > 0
        assert s["pushes_applied"] + s["pushes_lost"] == 3 * 30
        assert read_result(job).steps == 30 and acc > 0.3
    bsp_stats = accuracy(bsp)[1]
    assert bsp_stats["server_updates"] == 30  # one per round: no round hung on a lost push
    acc, s = accuracy(killed)
    assert s["workers_lost"] == [1] and s["server_updates"] == 30 and acc > 0.3


def _kill_one(rank: int, world: int, job: Job) -> None:
    ps.process_main(rank, world, job)


def test_bsp_worker_loss_stops_cleanly_by_flag(tmp_path):
    job = make(tmp_path, strategy="bsp", workers=2, servers=1, max_steps=30,
               kill_worker="1@5", on_worker_loss="stop")
    with pytest.raises(WorkerFailed, match=r"shard 0: worker\(s\) \[1\] .*presumed dead"):
        spawn(_kill_one, 3, (job,), survivable=WORKERS)


# ---- slow study (pytest -m slow) ---------------------------------------------------------

FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.slow
@pytest.mark.skipif(not FASHION.is_dir(), reason="Fashion-MNIST is not installed")
def test_lenet_fashion_mnist_kill_one_of_four_asp_workers(tmp_path):
    opts = {"strategy": "asp", "workers": 4, "servers": 2, "epochs": 2, "batch_size": 64,
            "rule": "adam", "lr": 0.001, "progress": False, "tensorboard": False,
            "ps_timeout": 10.0, "heartbeat_s": 1.0}
    clean = phalanx.train("lenet5", "fashion-mnist", out=str(tmp_path / "clean"), **opts)
    # worker 2 dies half-way through the first epoch (234 steps per epoch per worker)
    killed = phalanx.train("lenet5", "fashion-mnist", out=str(tmp_path / "killed"),
                           kill_worker="2@117", **opts)
    a, b = clean.summary["test_accuracy"], killed.summary["test_accuracy"]
    print(f"lenet5 fashion-mnist asp 4 workers: fault-free {a:.4f}, killed {b:.4f}")
    assert killed.summary["workers_lost"] == [2]
    assert abs(a - b) <= 0.01
