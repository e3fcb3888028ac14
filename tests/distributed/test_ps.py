"""The parameter server over real processes (gloo): every strategy learns, summary fields,
bad pushes are rejected, a silent worker ends the run with an error, torchrun works.

The convergence study on Fashion-MNIST (LeNet-5, 4 workers, 2 shards, 2 epochs, every
strategy >= 0.85) and the ASP staleness-vs-N table are ``@pytest.mark.slow``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

import phalanx
from phalanx.config import RunConfig
from phalanx.entry.api import make_job
from phalanx.parallel import ps
from phalanx.parallel.base import Job, read_result
from phalanx.runtime.launch import WorkerFailed, spawn

REPO = Path(__file__).resolve().parents[2]
STRATEGIES = {
    "bsp": {},
    "asp": {},
    "ssp": {"staleness": 1},
    "softsync": {"softsync": 2, "staleness_lr": True},
    "downpour": {"nfetch": 2, "npush": 2, "rule": "adagrad", "lr": 0.02},
    "dc-asgd": {"dc_lambda": 0.04, "dc_adaptive": True},
}


def make(tmp: Path, **options) -> Job:
    values = {"model": "mlp", "data": "synthetic", "batch_size": 32, "max_steps": 30,
              "lr": 0.1, "workers": 2, "servers": 2, "progress": False,
              "tensorboard": False, "out": str(tmp), "ps_timeout": 30.0}
    values.update(options)
    return make_job(RunConfig.from_mapping(values).validate())


def _sequence(rank: int, world: int, jobs: list[Job]) -> None:
    for job in jobs:
        ps.process_main(rank, world, job)
        dist.barrier()  # the next run starts only when this one's messages are all consumed


def test_every_strategy_learns_over_real_processes(tmp_path):
    jobs = [make(tmp_path / name, strategy=name, **opts) for name, opts in STRATEGIES.items()]
    for job in jobs:
        job.run_dir.mkdir(parents=True, exist_ok=True)
    spawn(_sequence, 4, (jobs,))
    for job in jobs:
        out = read_result(job)
        s = out.stats
        _, acc = phalanx.parallel.base.evaluate(out.model, job.test)
        name = job.config.strategy
        assert acc > 0.3, (name, acc)  # 10 classes: chance is 0.1
        assert out.steps == 30 and out.train_samples == 2 * 30 * 32
        assert s["pushes_rejected"] == 0 and s["bytes_sent"] > 0
        assert s["bytes_per_sample"] == pytest.approx(s["bytes_sent"] / out.train_samples)
        assert sum(s["staleness_histogram"]) == s["pushes_applied"]
        pushes = 2 * 2 * (15 if name == "downpour" else 30)  # workers x shards x pushes
        assert s["pushes_applied"] == pushes, name
        if name == "bsp":
            assert s["staleness_max"] == 0 and s["server_updates"] == 30
        if name == "ssp":
            # a worker may run 1 clock ahead: the other can be at most ~2 updates behind
            assert s["staleness_max"] <= 2 * (1 + 1)
        events = [json.loads(ln) for ln in (job.run_dir / "events.jsonl").read_text().splitlines()]
        kinds = {e["kind"] for e in events}
        assert {"train", "eval", "apply"} <= kinds
        applied = [e for e in events if e["kind"] == "apply"]
        assert len(applied) == s["pushes_applied"]


def test_api_run_writes_summary_with_staleness_and_bytes(tmp_path):
    result = phalanx.train("mlp", "synthetic", strategy="ssp", staleness=2, workers=2,
                           servers=1, batch_size=32, max_steps=25, lr=0.1, progress=False,
                           tensorboard=False, slow_workers="1:2.0", out=str(tmp_path))
    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in ("staleness_mean", "staleness_max", "staleness_histogram", "bytes_sent",
                "bytes_per_sample", "pushes_applied", "pushes_rejected", "test_accuracy"):
        assert key in summary, key
    assert summary["test_accuracy"] > 0.3 and summary["steps"] == 25
    assert result.summary == summary


def _one_worker_hangs(rank: int, world: int, job: Job) -> None:
    if rank == 2:  # worker 1: alive, but never talks to the servers (a hung process)
        time.sleep(60)
        return
    ps.process_main(rank, world, job)


def test_silent_worker_ends_the_run_with_a_clear_error_under_stop(tmp_path):
    job = make(tmp_path, strategy="asp", workers=2, servers=1, ps_timeout=3.0, epochs=50,
               max_steps=10_000, on_worker_loss="stop")
    job.run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    # either worker 0 is still pushing (worker 1 "silent for more than 2 s") or nothing
    # arrived at all for 2 s (worker 1 "presumed dead"): both name the hung worker only
    with pytest.raises(WorkerFailed, match=r"shard 0: .*worker\(s\) \[1\] "):
        spawn(_one_worker_hangs, 3, (job,))
    assert time.perf_counter() - t0 < 50


def test_torchrun_on_localhost(tmp_path):
    torchrun = Path(sys.executable).parent / "torchrun"
    cmd = [str(torchrun), "--standalone", "--log-dir", str(tmp_path / "torchelastic"),
           "--nproc-per-node", "3", "-m",
           "phalanx.entry.torchrun", "--strategy", "asp", "--workers", "2",
           "--servers", "1", "--model", "mlp", "--data", "synthetic", "--max-steps", "20",
           "--batch-size", "32", "--lr", "0.1", "--no-progress", "--no-tensorboard",
           "--out", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["launcher"] == "torchrun" and summary["steps"] == 20
    assert summary["pushes_applied"] == 2 * 20 and summary["test_accuracy"] > 0.2


# ---- slow studies (pytest -m slow) ---------------------------------------------------------

FASHION = Path("/usr/share/datasets/fashion-mnist")
# the server-side optimizer: Adam (BSP's batch is 4x larger: 2x the lr). Downpour with
# AdaGrad (DistBelief's choice) reached 0.835 (lr 0.01), 0.70 (0.03), diverged (0.1) here:
# its first steps are lr-sized in every coordinate; Adam is used instead
STUDY = {
    "bsp": {"rule": "adam", "lr": 0.002},
    "asp": {"rule": "adam", "lr": 0.001},
    "ssp": {"rule": "adam", "lr": 0.001, "staleness": 3},
    "softsync": {"rule": "adam", "lr": 0.001, "softsync": 2},
    "downpour": {"rule": "adam", "lr": 0.001, "nfetch": 2, "npush": 2},
    "dc-asgd": {"rule": "adam", "lr": 0.001, "dc_lambda": 0.04},
}


@pytest.mark.slow
@pytest.mark.skipif(not FASHION.is_dir(), reason="Fashion-MNIST is not installed")
@pytest.mark.parametrize("strategy", list(STUDY))
def test_lenet_fashion_mnist_two_epochs(tmp_path, strategy):
    result = phalanx.train("lenet5", "fashion-mnist", strategy=strategy, workers=4, servers=2,
                           epochs=2, batch_size=64, progress=False, tensorboard=False,
                           out=str(tmp_path), **STUDY[strategy])
    s = json.loads((tmp_path / "summary.json").read_text())
    print(strategy, {k: s[k] for k in ("test_accuracy", "staleness_mean", "staleness_max",
                                       "bytes_sent", "wall_s")})
    assert s["test_accuracy"] >= 0.85
    assert result.summary["staleness_max"] >= 0


@pytest.mark.slow
def test_asp_staleness_grows_with_workers(tmp_path):
    means = {}
    for n in (2, 4, 8):
        r = phalanx.train("mlp", "synthetic", strategy="asp", workers=n, servers=1,
                          batch_size=16, max_steps=40, progress=False, tensorboard=False,
                          out=str(tmp_path / str(n)))
        means[n] = r.summary["staleness_mean"]
    print("asp staleness mean by N:", means)
    assert means[2] < means[4] < means[8]
