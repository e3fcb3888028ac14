"""GlooTransport's concurrent receives over real processes: a shard that takes every
worker's message at once (a thread per worker) and a worker that takes S shards' answers
at once (``recv_from``) still deliver each message whole, in each sender's order, in the
order asked; the threads end with each worker's DONE; a failure names its peer."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import torch

from phalanx.comm.transport import GlooTransport, PeerLost
from phalanx.comm.wire import Header, Kind
from phalanx.runtime.launch import spawn

SHARDS, WORKERS, MESSAGES = 2, 2, 4


def _payload(worker: int, shard: int, i: int) -> torch.Tensor:
    # large enough to be in flight for a while, and unlike every other message's
    return torch.full((50_000 + 1000 * i,), float(100 * worker + 10 * shard + i))


def _exchange(rank: int, world: int, out: str) -> None:
    if rank < SHARDS:
        t = GlooTransport(rank, world, concurrent=range(SHARDS, world))
        got, done = [], 0
        while done < WORKERS:
            m = t.recv(timeout_s=60)
            if m.header.kind == Kind.DONE:
                done += 1
                continue
            w = m.src - SHARDS
            got.append([w, m.header.clock, m.tensors[0].numel(),
                        bool(torch.equal(m.tensors[0], _payload(w, rank, m.header.clock)))])
            if m.header.clock == MESSAGES - 1:  # answer the last one, shard 1 first
                time.sleep(0.3 if rank == 0 else 0.0)
                t.send(m.src, Header(Kind.PARAMS, worker=w, shard=rank),
                       [torch.full((30_000,), float(rank + 1))])
        time.sleep(0.2)  # the threads' ends after their DONE
        alive = sorted(th.name for th in threading.enumerate() if th.name.startswith("recv-"))
        t.flush()
        Path(out, f"shard{rank}.json").write_text(json.dumps({"got": got, "alive": alive}))
        return
    t = GlooTransport(rank, world)
    w = rank - SHARDS
    for i in range(MESSAGES):
        for k in range(SHARDS):
            t.send(k, Header(Kind.PUSH, worker=w, clock=i, shard=k), [_payload(w, k, i)])
    answers = t.recv_from(list(range(SHARDS)), timeout_s=60)
    for k in range(SHARDS):
        t.send(k, Header(Kind.DONE, worker=w, shard=k), [torch.zeros(5, dtype=torch.float64)])
    t.flush()
    Path(out, f"worker{w}.json").write_text(json.dumps(
        [[a.src, a.tensors[0].numel(), float(a.tensors[0][0]), float(a.tensors[0][-1])]
         for a in answers]))


def test_messages_arrive_whole_in_order_and_the_threads_end(tmp_path):
    spawn(_exchange, SHARDS + WORKERS, (str(tmp_path),))
    for k in range(SHARDS):
        r = json.loads((tmp_path / f"shard{k}.json").read_text())
        assert r["alive"] == [], r["alive"]  # every worker's thread ended with its DONE
        got = r["got"]
        assert len(got) == WORKERS * MESSAGES
        assert all(ok for *_, ok in got), got  # every payload whole and its own
        for w in range(WORKERS):  # each worker's messages in the order it sent them
            assert [c for ww, c, _, _ in got if ww == w] == list(range(MESSAGES))
    for w in range(WORKERS):
        answers = json.loads((tmp_path / f"worker{w}.json").read_text())
        # in the order asked (shard 0, then 1) though shard 1 answered first
        assert answers == [[0, 30_000, 1.0, 1.0], [1, 30_000, 2.0, 2.0]]


def _lost(rank: int, world: int, out: str) -> None:
    t = GlooTransport(rank, world)
    if rank == 2:  # shard 2 dies without answering; shard 1 answers
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 1:
        t.send(0, Header(Kind.PARAMS, worker=0, shard=0), [torch.ones(10)])
        t.flush()
        time.sleep(3)
        return
    try:
        t.recv_from([1, 2], timeout_s=30)
        seen = "nothing"
    except PeerLost as e:
        seen = f"lost {e.rank}"
    Path(out).write_text(seen)


def test_a_lost_sender_is_named(tmp_path):
    out = tmp_path / "seen.txt"
    spawn(_lost, 3, (str(out),), survivable=lambda r: r == 2)
    assert out.read_text() == "lost 2"
