"""What the goodput policy reads from a parameter-server job: under BSP, the shards' shares
of McCandlish's two-batch estimate (``ps/noise_part.py``) add up, in the observer, to the
estimate from the whole gradients; the other consistency models log none (the policy goes
by throughput for them)."""

from __future__ import annotations

import json

import torch

from phalanx.cluster.live.observe import EventTail, JobObserver
from phalanx.comm.wire import Header, Kind
from phalanx.metrics.noise import two_batch_estimate
from phalanx.ps.consistency import Asynchronous, BulkSynchronous
from phalanx.ps.partition import Partition
from phalanx.ps.shard import WANT_DENSE, ShardState
from phalanx.rules import sgd

BOUNDS = (0, 3, 7)   # two shards: 3 and 4 values


def shards(consistency, log) -> list[ShardState]:
    part = Partition(2, (0,), ((7,),), BOUNDS)
    out = []
    for k in range(2):
        s = ShardState(k, part, torch.zeros(BOUNDS[k + 1] - BOUNDS[k]), None, sgd(0.1),
                       consistency, 3, log=lambda kind, k=k, **f: log(kind, rank=k, **f))
        s.noise_batch = 32
        out.append(s)
    return out


def one_iteration(states: list[ShardState], grads: list[torch.Tensor]) -> None:
    for s in states:
        a, b = BOUNDS[s.shard], BOUNDS[s.shard + 1]
        for w, g in enumerate(grads):
            s.handle(w, Header(Kind.PULL, worker=w, clock=s.clocks[w], flags=WANT_DENSE,
                               shard=s.shard), [])
            s.handle(w, Header(Kind.PUSH, worker=w, clock=s.clocks[w], seq=s.clocks[w],
                               version=s.version, shard=s.shard), [g[a:b].clone()])


def test_bsp_shares_add_up_to_the_whole_gradients_estimate(tmp_path):
    path = tmp_path / "events.jsonl"
    with path.open("w") as f:
        def log(kind, **fields):
            f.write(json.dumps({"kind": kind, **fields}) + "\n")
        states = shards(BulkSynchronous(), log)
        gen = torch.Generator().manual_seed(0)
        grads = [torch.randn(7, generator=gen) + 1.0 for _ in range(3)]
        one_iteration(states, grads)   # version 0: measured (every 10th update)
    assert all(s.version == 1 for s in states)
    obs = JobObserver(EventTail(path))
    obs.read(1)
    whole = torch.stack(grads)
    g2_small = float(whole.double().pow(2).sum(1).mean())
    g2_big = float(whole.double().mean(0).pow(2).sum())
    g2, s = two_batch_estimate(g2_small, g2_big, 32, 96)
    # (float32 means on the shards)
    assert abs(obs.g2 - g2) < 1e-5 * abs(g2) and abs(obs.s - s) < 1e-5 * abs(s)
    assert not obs.parts   # both shares were used, none waits


def test_asynchronous_pushes_give_no_estimate(tmp_path):
    events = []
    states = shards(Asynchronous(), lambda kind, **f: events.append(kind))
    states[0].noise_batch = states[1].noise_batch = 32   # even if asked: one push an update
    one_iteration(states, [torch.ones(7)] * 3)
    assert "noise_part" not in events and "apply" in events


def test_the_observer_reads_a_run_folder_started_anew(tmp_path):
    """A job stopped before its first checkpoint starts anew in a cleared folder: its new
    events file is read from the start, not from the old file's offset."""
    path = tmp_path / "events.jsonl"
    path.write_text('{"kind": "a"}\n{"kind": "b"}\n')
    tail = EventTail(path)
    assert [e["kind"] for e in tail.new()] == ["a", "b"]
    path.write_text('{"kind": "c"}\n')
    assert [e["kind"] for e in tail.new()] == ["c"]
