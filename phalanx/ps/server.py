"""The shard server loop: receive a message, let the :class:`ShardState` handle it, send the
replies; then, when every worker is done, hand the shard's parameters to server 0.

World layout (see ``docs/parameter-server.md``): ranks ``0..S-1`` are server shards,
ranks ``S..S+N-1`` are workers ``0..N-1``. Server 0 assembles the final model, so under
``torchrun`` on several machines the result is written where rank 0 runs.

Liveness: the loop knows which workers are active and which it is holding back (parked
pulls). An active worker that is not held back and has been silent for ``timeout_s``, or
no message at all for ``timeout_s``, ends the run with an error that names the workers —
never a hang. (Heartbeats and recovery can be added here: a HEARTBEAT kind would refresh
``last_heard``; a dead worker could be dropped from ``state.active`` instead of raising.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from phalanx.comm.counters import ByteCounter, nbytes
from phalanx.comm.transport import Message, PeerLost, Transport, TransportTimeout
from phalanx.comm.wire import HEADER_BYTES, Header, Kind, WireError
from phalanx.errors import PhalanxError
from phalanx.ps.shard import ShardState, ShardStats


@dataclass(frozen=True)
class Layout:
    servers: int
    workers: int

    @property
    def world(self) -> int:
        return self.servers + self.workers

    def server_rank(self, shard: int) -> int:
        return shard

    def worker_rank(self, worker: int) -> int:
        return self.servers + worker

    def worker_of(self, rank: int) -> int | None:
        w = rank - self.servers
        return w if 0 <= w < self.workers else None


@dataclass
class ShardResult:
    """What one shard holds at the end (sent to server 0 as a FINAL message)."""

    shard: int
    dense: torch.Tensor
    rows: torch.Tensor | None
    counters: list[float]  # STAT_FIELDS + staleness histogram
    worker_stats: dict[int, list[torch.Tensor]] = field(default_factory=dict)

    @property
    def histogram(self) -> list[int]:
        return [int(c) for c in self.counters[len(STAT_FIELDS):]]

    def stat(self, name: str) -> float:
        return self.counters[STAT_FIELDS.index(name)]


STAT_FIELDS = ("pushes_applied", "pushes_rejected", "messages_rejected", "updates",
               "bytes_sent", "bytes_received")


def serve(state: ShardState, transport: Transport, layout: Layout, timeout_s: float,
          now: Callable[[], float] = time.monotonic) -> list[Message]:
    """Run the shard until every worker sent DONE. Returns messages from other servers that
    arrived early (server 0 may get a FINAL before its own workers are done)."""
    early: list[Message] = []
    last_heard = {w: now() for w in range(layout.workers)}
    while state.active:
        try:
            msg = transport.recv(timeout_s=timeout_s)
        except TransportTimeout:
            silent = sorted(state.active - state.waiting)
            raise PhalanxError(f"parameter server shard {state.shard}: no message for "
                               f"{timeout_s:g} s; worker(s) {silent} presumed dead") from None
        except WireError as e:
            state.reject_message(f"bad header: {e}")
            continue
        except PeerLost as e:
            raise PhalanxError(f"parameter server shard {state.shard}: a peer process failed "
                               f"or exited ({e})") from None
        w = layout.worker_of(msg.src)
        if w is None:
            if msg.header.kind in (Kind.FINAL,) and msg.src < layout.servers:
                early.append(msg)
            else:
                state.reject_message("message from a non-worker rank")
            continue
        if msg.header.worker != w:
            state.reject_message("header names another worker than its sender")
            continue
        t = now()
        last_heard[w] = t
        for out in state.handle(w, msg.header, msg.tensors):
            transport.send(layout.worker_rank(out.worker), out.header, out.tensors)
            last_heard[out.worker] = t  # its silence while we held it back was our doing
        dead = sorted(a for a in state.active - state.waiting if t - last_heard[a] > timeout_s)
        if dead:
            raise PhalanxError(f"parameter server shard {state.shard}: worker(s) {dead} silent "
                               f"for more than {timeout_s:g} s; presumed dead")
    return early


def _counters(stats: ShardStats, counter: ByteCounter, extra_sent: int = 0) -> list[float]:
    values = {"pushes_applied": stats.pushes_applied, "pushes_rejected": stats.pushes_rejected,
              "messages_rejected": stats.messages_rejected, "updates": stats.updates,
              "bytes_sent": counter.sent + extra_sent, "bytes_received": counter.received}
    return [float(values[k]) for k in STAT_FIELDS] + [float(c) for c in stats.histogram()]


def send_final(state: ShardState, transport: Transport, layout: Layout) -> None:
    """A shard other than 0 hands its parameters and counters to server 0."""
    rows = state.rows.reshape(-1) if state.rows is not None else torch.zeros(0)
    payload_bytes = HEADER_BYTES + nbytes(state.dense, rows)
    counters = _counters(state.stats, transport.counter, payload_bytes)
    counters_t = torch.tensor(counters, dtype=torch.float64)
    payload_bytes += nbytes(counters_t)
    counters_t[STAT_FIELDS.index("bytes_sent")] = transport.counter.sent + payload_bytes
    transport.send(layout.server_rank(0), Header(Kind.FINAL, shard=state.shard),
                   [state.dense, rows, counters_t])
    transport.flush()


def gather_final(state: ShardState, transport: Transport, layout: Layout,
                 early: list[Message], timeout_s: float) -> list[ShardResult]:
    """Server 0 collects every shard's FINAL message (its own state included)."""
    results = {0: ShardResult(0, state.dense, state.rows,
                              _counters(state.stats, transport.counter), state.worker_stats)}
    pending = list(early)
    while len(results) < layout.servers:
        if pending:
            msg = pending.pop(0)
        else:
            try:
                msg = transport.recv(timeout_s=timeout_s)
            except TransportTimeout:
                missing = sorted(set(range(layout.servers)) - set(results))
                raise PhalanxError(f"parameter server 0: shard(s) {missing} never sent their "
                                   f"parameters ({timeout_s:g} s)") from None
            except WireError as e:
                state.reject_message(f"bad header: {e}")
                continue
        k = msg.header.shard
        if msg.header.kind != Kind.FINAL or msg.src != layout.server_rank(k) or k in results:
            state.reject_message("unexpected message while gathering the final model")
            continue
        a, b = state.part.dense_range(k)
        dense, rows, counters = msg.tensors
        dim = state.part.table.dim if state.part.table else 0
        if dense.numel() != b - a or rows.numel() != state.part.local_rows(k) * dim:
            raise PhalanxError(f"parameter server 0: shard {k} sent parameters of the wrong size")
        results[k] = ShardResult(k, dense, rows.view(-1, dim) if dim else None,
                                 counters.tolist())
    return [results[k] for k in range(layout.servers)]
