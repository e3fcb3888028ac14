"""Elastic resize of parameter-server runs (``parallel/ps_resize.py``, ``ps/resize.py``).

Real ``phalanx train`` runs (asp, ssp; 2 shards) are stopped by SIGTERM once every shard
has checkpointed, as the live scheduler stops a parameter-server job, resized 2 -> 3 -> 1
workers (the batch changes too) and resumed with ``--resume``. The clocks after each
resize are one common clock at the run's mean position in epochs on every shard (a naive
copy leaves new workers at 0 and the survivors where they were: unequal clocks, which
hold BSP's survivors while the new worker's pushes pile up unapplied, and replay data).
The shards' own history carries over, the resumed workers start at that clock, SSP's
bound holds afterwards, and the run finishes its epochs and keeps learning. Refusals
leave the folder as it was.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from phalanx.comm.wire import Header, Kind
from phalanx.config import RunConfig
from phalanx.entry.api import make_job
from phalanx.entry.resize import default_lr, resize_run, resized_settings, run_config
from phalanx.errors import ConfigError
from phalanx.parallel.registry import check_config
from phalanx.ps.consistency import BulkSynchronous
from phalanx.ps.partition import Partition
from phalanx.ps.resize import common_clock
from phalanx.ps.shard import WANT_DENSE, ShardState
from phalanx.rules import sgd
from phalanx.runtime.checkpoint import load_checkpoint
from phalanx.runtime.preempt import PREEMPTED_EXIT

REPO = Path(__file__).resolve().parents[2]
SERVERS, EPOCHS, STALENESS = 2, 2, 1


def shards(run: Path) -> list[dict]:
    return [load_checkpoint(run / f"ps_shard{k}.ckpt") for k in range(SERVERS)]


def events(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "events.jsonl").read_text().splitlines()]


def train(args: list[str], run: Path, stop: bool) -> subprocess.CompletedProcess:
    """``phalanx train ARGS``; ``stop``: SIGTERM once every shard wrote a checkpoint since
    this start (the run then resumes from those, as after a scheduler's stop)."""
    ev = run / "events.jsonl"
    seen = len(ev.read_text().splitlines()) if ev.exists() else 0
    p = subprocess.Popen([sys.executable, "-m", "phalanx.cli", "train", *args, "--no-progress"],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while stop and p.poll() is None and time.monotonic() < deadline:
        new = [json.loads(ln) for ln in ev.read_text().splitlines()[seen:]] \
            if ev.exists() else []
        if {e["shard"] for e in new if e["kind"] == "checkpoint"} == set(range(SERVERS)):
            p.send_signal(signal.SIGTERM)
            break
        time.sleep(0.02)
    out, _ = p.communicate(timeout=120)
    return subprocess.CompletedProcess(p.args, p.returncode, out)


# ssp in the suite (its bound is the invariant a resize can break); asp, whose clocks go
# through the same common_clock, with -m slow (its live resize is in test_live_elastic.py)
@pytest.fixture(scope="module", params=[pytest.param("asp", marks=pytest.mark.slow), "ssp"])
def story(request, tmp_path_factory):
    """One run: 2 workers x 64 -> stop -> resize 3 x 32 -> resume, stop -> resize 1 x 64
    -> resume to the end. What each step saw."""
    strategy = request.param
    run = tmp_path_factory.mktemp(strategy) / "run"
    extra = ["--staleness", str(STALENESS)] if strategy == "ssp" else []
    first = train(["--strategy", strategy, "--model", "mlp", "--data", "synthetic",
                   "--workers", "2", "--servers", str(SERVERS), "--batch-size", "64",
                   "--epochs", str(EPOCHS), "--checkpoint-every", "20", "--threads", "1",
                   "--no-tensorboard", "--out", str(run), *extra], run, stop=True)
    # the shards wrote their state as they stopped: a preemption (PREEMPTED_EXIT)
    assert first.returncode == PREEMPTED_EXIT, first.stdout
    spare = run.parent / "spare"
    shutil.copytree(run, spare)   # a stopped run for the refusal test
    s = {"strategy": strategy, "run": run, "spare": spare, "steps": []}
    for workers, batch in ((3, 32), (1, 64)):
        before, cfg = shards(run), run_config(run)
        s["steps"].append((cfg, before, resize_run(run, workers, batch), shards(run),
                           run_config(run), len(events(run))))
        last = workers == 1
        r = train(["--resume", str(run)], run, stop=not last)
        assert r.returncode == (0 if last else PREEMPTED_EXIT), r.stdout
    s["summary"] = json.loads((run / "summary.json").read_text())
    s["n"] = len(make_job(run_config(run)).train)
    return s


def test_resize_puts_every_worker_at_one_clock_at_the_runs_mean_position(story):
    for old, before, (_, new_step), after, new, _ in story["steps"]:
        per_old = story["n"] // old.workers // old.batch_size
        per_new = story["n"] // new.workers // new.batch_size
        clocks = [min(int(p["clocks"][w]) for p in before) for w in range(old.workers)]
        mean_epochs = sum(clocks) / old.workers / per_old
        clock = int(after[0]["clocks"][0])
        for p in after:
            # one common clock on every shard, for the new worker count
            assert p["workers"] == new.workers
            assert p["clocks"].tolist() == [clock] * new.workers
        assert clock == new_step
        # the same position in epochs (to one step of the new size), not a copy
        assert abs(clock / per_new - mean_epochs) <= 1 / per_new, (clock, clocks)
        assert clock > 0
        for p, q in zip(before, after):
            # the shard's parameters, rule state, version and history carry over
            assert torch.equal(p["dense"], q["dense"]) and p["version"] == q["version"]
            assert torch.equal(p["counters"], q["counters"])
            assert torch.equal(p["staleness"], q["staleness"])
            assert int(q["staleness"].sum()) == int(q["counters"][0])   # pushes applied


def test_resumed_workers_start_at_the_common_clock_and_keep_the_bound(story):
    evs = events(story["run"])
    for _, _, (_, new_step), _, new, seen in story["steps"]:
        resumed = [e for e in evs[seen:] if e["kind"] == "resume" and e["role"] == "worker"]
        assert sorted(e["worker"] for e in resumed[:new.workers]) == list(range(new.workers))
        assert {e["clock"] for e in resumed[:new.workers]} == {new_step}
    if story["strategy"] == "ssp":
        # checkpointed while 3 resized workers ran: no worker beyond the bound (a push
        # ahead of a pull: s + 1)
        _, before, *_ = story["steps"][1]
        for p in before:
            assert int(p["clocks"].max() - p["clocks"].min()) <= STALENESS + 1


def test_resized_run_finishes_its_epochs_and_keeps_learning(story):
    summary, n = story["summary"], story["n"]
    assert summary["workers"] == 1 and summary["servers"] == SERVERS
    per_epoch = n // 64
    assert summary["steps"] == EPOCHS * per_epoch
    assert summary["train_samples"] == EPOCHS * per_epoch * 64
    train = [e for e in events(story["run"]) if e["kind"] == "train"]
    assert max(e["epoch"] for e in train) == EPOCHS - 1
    first, last = train[: len(train) // 4], train[-len(train) // 4:]
    assert sum(e["loss"] for e in last) / len(last) < 0.5 * sum(
        e["loss"] for e in first) / len(first)
    assert summary["test_accuracy"] > 0.9


def digest(run: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in run.iterdir()
            if p.is_file()}


def test_what_cannot_be_resized_is_refused_and_left_as_it_was(story, tmp_path):
    if story["strategy"] != "ssp":
        pytest.skip("one stopped run is enough")
    run = tmp_path / "run"
    shutil.copytree(story["spare"], run)
    values = json.loads((run / "config.json").read_text())
    cases = [
        (3, 10_000, {}, "leaves a shard of fewer than 1 micro-batches"),
        (1, 64, {"slow_workers": {"1": 2.0}}, "--slow-workers: rank 1 does not exist"),
        (3, 64, {"kill_worker": "1@400"}, "injected faults"),
    ]
    for workers, batch, change, why in cases:
        (run / "config.json").write_text(json.dumps({**values, **change}, indent=2) + "\n")
        was = digest(run)
        with pytest.raises(ConfigError, match=why.replace("-", r"\-")):
            resize_run(run, workers, batch)
        assert digest(run) == was
    (run / "config.json").write_text(json.dumps(values, indent=2) + "\n")
    (run / "ps_shard1.ckpt").unlink()
    with pytest.raises(ConfigError, match="ps_shard1.ckpt"):
        resize_run(run, 3, 64)


def test_what_follows_the_worker_count():
    def cfg(**kw) -> RunConfig:
        base = {"model": "mlp", "data": "synthetic", "workers": 4, "servers": 1}
        return RunConfig.from_mapping({**base, **kw}, source="test")

    # softsync keeps n / W (its place between ASP and BSP), within 1..W'
    soft = cfg(strategy="softsync", softsync=2, lr=0.05)
    assert [resized_settings(soft, w, 64).softsync for w in (1, 2, 6, 8)] == [1, 1, 3, 4]
    # bsp's default lr is a fresh run's for W'; a user's lr stays
    bsp = check_config(cfg(strategy="bsp"))
    assert (bsp.rule, bsp.lr) == ("momentum", 0.02)
    assert resized_settings(bsp, 2, 64).lr == 0.01
    assert resized_settings(cfg(strategy="bsp", lr=0.3, rule="momentum"), 2, 64).lr == 0.3
    # the same rule for sync's resize (config.json records the default resolved); plain
    # SGD of a one-worker start stays (its state has no momentum)
    assert default_lr(check_config(cfg(strategy="sync")), 8) == 0.04
    assert default_lr(check_config(cfg(strategy="sync", workers=1)), 2) == 0.05
    # max_steps keeps the sample budget
    assert resized_settings(cfg(strategy="asp", max_steps=100, lr=0.05), 2, 128).max_steps \
        == 100
    # the mean position, down to a whole push: workers at 10 and 13 steps of 31 per epoch
    # (mean 11.5) at 2 accumulated micro-batches x npush 2 = 4 micro-batches per push
    assert common_clock([10, 13], 2, 2, 62, 40) == 3   # 23 / 62 x 40 = 14.8 -> 15 -> 3
    assert common_clock([62, 62], 1, 1, 62, 40) == 40  # one epoch is one epoch


FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.slow
@pytest.mark.skipif(not FASHION.is_dir(), reason="Fashion-MNIST is not installed")
@pytest.mark.parametrize("strategy", ["asp", "ssp"])
def test_resized_runs_reach_the_accuracy_of_unresized_ones(tmp_path, strategy):
    """MLP, 8,000 Fashion-MNIST images, 3 epochs, 2 shards, seeds 0-2: a run resized
    2 -> 3 (batch 32) -> 1 (batch 64) workers, stopped at its first checkpoints, against
    the same run left at 2 workers. Where it stops differs run to run (SIGTERM)."""
    args = ["--strategy", strategy, "--model", "mlp", "--data", "fashion-mnist",
            "--train-limit", "8000", "--test-limit", "2000", "--workers", "2", "--servers",
            str(SERVERS), "--epochs", "3", "--checkpoint-every", "40", "--threads", "1",
            "--no-tensorboard"]
    acc: dict[str, list[float]] = {"fixed": [], "resized": []}
    for seed in range(3):
        fixed, run = tmp_path / f"fixed{seed}", tmp_path / f"resized{seed}"
        assert train([*args, "--seed", str(seed), "--out", str(fixed)], fixed,
                     stop=False).returncode == 0
        train([*args, "--seed", str(seed), "--out", str(run)], run, stop=True)
        resize_run(run, 3, 32)
        train(["--resume", str(run)], run, stop=True)
        resize_run(run, 1, 64)
        assert train(["--resume", str(run)], run, stop=False).returncode == 0
        for name, path in (("fixed", fixed), ("resized", run)):
            summary = json.loads((path / "summary.json").read_text())
            acc[name].append(summary["test_accuracy"])
            # 3 epochs of full batches: 2 x 62 x 64 a worker's, or 125 x 64 for the one
            assert summary["train_samples"] == 3 * (2 * 62 if name == "fixed" else 125) * 64
    mean = {k: sum(v) / len(v) for k, v in acc.items()}
    print(f"{strategy}: test accuracy fixed {acc['fixed']} (mean {mean['fixed']:.4f}), "
          f"resized {acc['resized']} (mean {mean['resized']:.4f})")
    assert abs(mean["resized"] - mean["fixed"]) < 0.03 and min(acc["resized"]) > 0.75


def test_bsp_needs_the_common_clock():
    """Why one common clock (ps/resize.py), on the BSP shard itself: resumed at equal
    clocks, a round of the 3 workers' pushes is one averaged update; at a naive copy's
    clocks (survivors at 5, the new worker at 0) the survivors are held at the barrier and
    the new worker's pushes pile up unapplied, all computed on the same weights."""
    part = Partition(1, (0,), ((2,),), (0, 2))

    def shard(clocks: list[int]) -> ShardState:
        s = ShardState(0, part, torch.zeros(2), None, sgd(0.1), BulkSynchronous(), 3)
        s.clocks = list(clocks)
        return s

    def pull(s: ShardState, w: int) -> list:
        return s.handle(w, Header(Kind.PULL, worker=w, clock=s.clocks[w], flags=WANT_DENSE),
                        [])

    def push(s: ShardState, w: int) -> None:
        s.handle(w, Header(Kind.PUSH, worker=w, clock=s.clocks[w], seq=s.clocks[w],
                           version=s.version), [torch.ones(2)])

    even = shard([5, 5, 5])
    assert all(pull(even, w) for w in range(3))     # every worker may start its step
    for w in range(3):
        push(even, w)
    assert even.version == 1 and even.stats.pushes_applied == 3
    naive = shard([5, 5, 0])
    assert not pull(naive, 0) and not pull(naive, 1)   # held at the barrier
    for _ in range(5):
        assert pull(naive, 2)
        push(naive, 2)
    assert naive.version == 0 and len(naive.buffer) == 5   # nothing applied yet
