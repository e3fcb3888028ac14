"""No lost work when a parameter-server run is stopped (issue 33), real processes through
the real CLI:

* SIGTERM to the run's process group (what ``phalanx schedule`` sends to stop a job) makes
  every shard write its state and the driver exit with ``PREEMPTED_EXIT`` in one line; no
  process is left. ``--checkpoint-every`` is far beyond the run here, so the stop's
  checkpoint is the only one: ``--resume`` can only continue from it.
* Every update is counted: across the stopped run and its resumption each shard version
  is applied exactly once and each worker's push (worker, clock) exactly once, so the
  totals equal an uninterrupted run's. ASP with one worker is deterministic: the resumed
  run's parameters equal an uninterrupted run's bit for bit.
* A worker lost under ``--on-worker-loss continue`` is recorded in the checkpoint; the
  resumed run keeps it out (its restarted process is told so and leaves).
* ``--on-worker-loss stop`` with a worker killed by ``kill -9``: the driver ends the run at
  once in one line saying so (issue 33, appendix 1), the shards write their state first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from stacks import communicate_or_dump
from test_signals import START_S, ranks

import phalanx
from phalanx.runtime.checkpoint import load_checkpoint
from phalanx.runtime.preempt import PREEMPTED_EXIT

STEPS = 125  # one epoch of the synthetic set at batch 32
RUN = {"model": "mlp", "data": "synthetic", "batch_size": 32, "ps_timeout": 2.0,
       "heartbeat_s": 0.5, "progress": False, "tensorboard": False,
       "checkpoint_every": 100_000}


def flags(options: dict) -> list[str]:
    out = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is False:
            out.append(f"--no-{key.replace('_', '-')}")
        else:
            out += [flag, str(value)]
    return out


def start(out: Path, **options) -> subprocess.Popen:
    """``phalanx train`` in a process group of its own, as the scheduler starts a job."""
    return subprocess.Popen([sys.executable, "-m", "phalanx.cli", "train",
                             *flags({**RUN, **options}), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def events(out: Path) -> list[dict]:
    try:
        lines = (out / "events.jsonl").read_text().splitlines()
    except OSError:
        return []
    return [json.loads(ln) for ln in lines if ln.endswith("}")]


def wait_for(cond, what: str, p: subprocess.Popen, timeout: float = START_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if p.poll() is not None:
            raise AssertionError(f"the run ended (exit {p.returncode}) before {what}: "
                                 f"{p.stderr.read()[-2000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def group_gone(pgid: int, timeout: float = 10.0) -> bool:
    """Every process of the group ``pgid`` ended (and was reaped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def stop(p: subprocess.Popen, said: int = 0) -> str:
    """SIGTERM to the whole group, as ``phalanx schedule`` stops a job: one line (after the
    ``said`` lines of earlier events), exit 75, nothing left."""
    os.killpg(p.pid, signal.SIGTERM)
    _, err = communicate_or_dump(p, 60)
    assert p.returncode == PREEMPTED_EXIT, err
    lines = err.splitlines()[said:]
    assert len(lines) == 1 and lines[0].startswith("phalanx: preempted by SIGTERM"), err
    assert "--resume" in lines[0]
    assert group_gone(p.pid), "a process of the stopped run was left"
    return err


def applied(ev: list[dict]) -> list[dict]:
    return [e for e in ev if e["kind"] == "apply" and e["role"] == "server"]


def assert_every_update_once(ev: list[dict], workers: int, steps: int,
                             servers: int = 1) -> None:
    """Across the stopped run and its resumption: each shard's versions 0..T-1 once each,
    and each worker's pushes (clocks 0..steps-1) once each on every shard."""
    for shard in range(servers):
        mine = [e for e in applied(ev) if e["shard"] == shard]
        versions = Counter(e["version"] for e in mine)
        assert sorted(versions) == list(range(len(versions))), "an update lost"
        assert max(versions.values()) == 1, "an update applied twice"
        pushes = Counter((e["worker"], e["clock"]) for e in mine)
        assert max(pushes.values()) == 1, [k for k, n in pushes.items() if n > 1]
        assert set(pushes) == {(w, c) for w in range(workers) for c in range(steps)}


def test_asp_one_worker_preempted_and_resumed_equals_an_uninterrupted_run(tmp_path):
    out = tmp_path / "run"
    p = start(out, strategy="asp", workers=1, slow_workers="0:20")
    wait_for(lambda: len(applied(events(out))) >= 20, "20 updates", p)
    stop(p)
    first = events(out)
    (ckpt,) = [e for e in first if e["kind"] == "checkpoint"]
    assert ckpt["reason"] == "stop" and ckpt["buffered"] == 0
    at = ckpt["version"]
    # the checkpoint holds every update applied before the stop, and nothing more
    assert at == len(applied(first)) and 20 <= at < STEPS
    assert load_checkpoint(out / "ps_shard0.ckpt")["version"] == at

    resumed = phalanx.train(resume=str(out))
    ev = events(out)
    assert [e["clock"] for e in ev[len(first):] if e["kind"] == "resume"
            and e["role"] == "worker"] == [at]
    assert_every_update_once(ev, workers=1, steps=STEPS)
    s = resumed.summary
    assert s["server_updates"] == s["pushes_applied"] == STEPS and s["steps"] == STEPS

    # (a straggler only sleeps: the values are the same without one)
    plain = phalanx.train(out=str(tmp_path / "plain"), strategy="asp", workers=1, **RUN)
    assert plain.summary["server_updates"] == STEPS
    a, b = resumed.model.state_dict(), plain.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed run drifted"


def test_ssp_two_workers_two_shards_count_every_update(tmp_path):
    out = tmp_path / "run"
    p = start(out, strategy="ssp", workers=2, servers=2, staleness=2,
              slow_workers="0:30,1:45")
    wait_for(lambda: len(applied(events(out))) >= 40, "40 updates", p)
    stop(p)
    first = events(out)
    ckpts = {e["shard"]: e for e in first if e["kind"] == "checkpoint"}
    assert set(ckpts) == {0, 1} and all(e["reason"] == "stop" for e in ckpts.values())
    for shard, e in ckpts.items():  # each shard saved exactly what it had applied
        assert e["version"] == len([a for a in applied(first) if a["shard"] == shard])
        assert e["version"] < STEPS

    s = phalanx.train(resume=str(out)).summary
    steps = s["steps"]  # each worker's half of the set
    assert steps == STEPS // 2
    assert_every_update_once(events(out), workers=2, steps=steps, servers=2)
    # a push that reached one shard before the stop and not the other is redone on the
    # other only: the first one ignores the repeat by its sequence number
    assert s["pushes_applied"] == 2 * 2 * steps and s["server_updates"] == 2 * steps
    assert s["pushes_lost"] == 0 and s["duplicates"] >= 0


def test_a_lost_ssp_worker_is_in_the_checkpoint_and_stays_out_after_resume(tmp_path):
    out = tmp_path / "run"
    # SSP with staleness 1: worker 0 cannot finish while worker 1 is dead and not yet
    # dropped (it waits at the bound), so the stop below comes while it trains, whatever
    # this machine's pace
    p = start(out, strategy="ssp", staleness=1, workers=2, on_worker_loss="continue",
              slow_workers="0:15,1:15", ps_timeout=1.0)
    wait_for(lambda: any(e["kind"] == "apply" and e["worker"] == 1 and e["clock"] >= 3
                         for e in events(out)), "worker 1's pushes", p)
    os.kill(ranks(p.pid)[-1], signal.SIGKILL)  # worker 1
    wait_for(lambda: any(e["kind"] == "worker_lost" for e in events(out)),
             "the shard to drop worker 1", p, timeout=30)
    assert "worker 1 was killed by SIGKILL; the run goes on without it" in stop(p, said=1)
    first = events(out)
    (ckpt,) = [e for e in first if e["kind"] == "checkpoint"]
    assert ckpt["lost"] == [1]
    lost_clock = ckpt["clocks"][1]
    saved = load_checkpoint(out / "ps_shard0.ckpt")["lost"].tolist()
    assert saved == [[1, lost_clock]]

    s = phalanx.train(resume=str(out)).summary
    ev = events(out)[len(first):]
    assert [e["worker"] for e in ev if e["kind"] == "left"] == [1]
    assert not [e for e in ev if e["kind"] == "reject"]  # its heartbeats are no error
    assert s["workers_lost"] == [1]
    pushes = Counter((e["worker"], e["clock"]) for e in applied(events(out)))
    assert max(pushes.values()) == 1
    # worker 0 made every step; worker 1 none after it was lost, before or after the stop
    assert {c for w, c in pushes if w == 0} == set(range(s["steps"]))
    assert {c for w, c in pushes if w == 1} == set(range(lost_clock))
    assert s["pushes_applied"] == s["steps"] + lost_clock


def test_on_worker_loss_stop_ends_the_run_at_once_when_a_worker_is_killed(tmp_path):
    out = tmp_path / "run"
    p = start(out, strategy="asp", workers=2, on_worker_loss="stop", ps_timeout=20.0,
              slow_workers="0:20,1:20")
    wait_for(lambda: len(applied(events(out))) >= 10, "10 updates", p)
    os.kill(ranks(p.pid)[1], signal.SIGKILL)  # worker 0 (rank 1: server 0 is rank 0)
    killed = time.monotonic()
    _, err = communicate_or_dump(p, 60)
    took = time.monotonic() - killed
    assert p.returncode == 2, err
    assert err.splitlines() == ["phalanx: error: worker 0 was killed by SIGKILL; "
                                "--on-worker-loss stop ends the run"], err
    # not --ps-timeout's 20 s: the driver saw the death itself (~1 s; 10 s leaves room for a
    # loaded machine)
    assert took < 10.0, took
    assert group_gone(p.pid)
    (ckpt,) = [e for e in events(out) if e["kind"] == "checkpoint"]
    assert ckpt["version"] == len(applied(events(out)))  # the shard kept what it had
