"""The shard server loop: receive a message, let the :class:`ShardState` handle it, send the
replies; then, when every worker is done, hand the shard's parameters to server 0.

World layout (see ``docs/parameter-server.md``): ranks ``0..S-1`` are server shards,
ranks ``S..S+N-1`` are workers ``0..N-1``. Server 0 assembles the final model, so under
``torchrun`` on several machines the result is written where rank 0 runs.

Liveness: every message from a worker refreshes when it was last heard of; workers send
HEARTBEAT messages from a background thread (``heartbeats=True``), so a live worker is
never silent, not even while the shard holds its pull back. A worker silent for
``timeout_s`` is dead. ``on_worker_loss="continue"`` drops it (:meth:`ShardState.drop_worker`:
barriers and bounds count the survivors) and the run goes on; ``"stop"`` ends the run
with an error that names it — never a hang. Without heartbeats (tests that drive the
shard by hand) a worker whose pull is held back is not watched.

A gloo receive that timed out cannot be waited on again, so ``timeout_s`` with no message
at all ends this loop: with heartbeats it means every remaining worker is dead.

Stops: where the shard's stop flag is armed (:mod:`phalanx.runtime.stop_flag`: a shard
that checkpoints), a SIGTERM ends this loop with :class:`~phalanx.runtime.stop_flag.Stop`
between two messages (at once while it waits for one), so the shard's state then holds
every message it took and none in part.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from phalanx.comm.counters import ByteCounter, nbytes
from phalanx.comm.transport import PeerLost, Transport, TransportTimeout
from phalanx.comm.wire import HEADER_BYTES, Header, Kind, WireError
from phalanx.errors import PhalanxError
from phalanx.ps.shard import Outgoing, ShardState, ShardStats
from phalanx.runtime import stop_flag
from phalanx.runtime.memory import keep_freed_memory


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
               "bytes_sent", "bytes_received", "pushes_lost", "duplicates", "workers_lost",
               "pull_resyncs")


def serve(state: ShardState, transport: Transport, layout: Layout, timeout_s: float,
          now: Callable[[], float] = time.monotonic, *, heartbeats: bool = False,
          on_worker_loss: str = "stop",
          after_update: Callable[[ShardState], None] | None = None) -> None:
    """Run the shard until every worker sent DONE or was dropped as dead.

    ``after_update(state)`` runs whenever the shard's version moved (checkpoints, fault
    injection)."""
    keep_freed_memory()  # receive buffers reused, not page-faulted in anew (runtime/memory)
    loop = _ServeLoop(state, transport, layout, timeout_s, now, heartbeats, on_worker_loss,
                      after_update)
    with state.overlapped():  # a push's update runs while the next message is received
        while state.active:
            loop.step()
            if stop_flag.requested():
                raise stop_flag.Stop()


class _ServeLoop:
    """:func:`serve`'s state between messages: when each worker was last heard of, the
    version last seen, and how many losses gloo would not attribute."""

    def __init__(self, state: ShardState, transport: Transport, layout: Layout,
                 timeout_s: float, now: Callable[[], float], heartbeats: bool,
                 on_worker_loss: str, after_update: Callable[[ShardState], None] | None
                 ) -> None:
        self.state, self.transport, self.layout = state, transport, layout
        self.timeout_s, self.now, self.heartbeats = timeout_s, now, heartbeats
        self.on_worker_loss, self.after_update = on_worker_loss, after_update
        self.last_heard = {w: now() for w in range(layout.workers)}
        self.version = state.version
        self.unnamed_losses = 0

    def step(self) -> None:
        """Receive one message and handle it (or the failure to receive one)."""
        state = self.state
        try:
            with stop_flag.interruptible():  # a message cut off here was never applied
                msg = self.transport.recv(timeout_s=self.timeout_s)
        except TransportTimeout:
            self.timed_out()
            return
        except WireError as e:
            state.reject_message(f"bad header: {e}")
            return
        except PeerLost as e:
            self.lost_worker(e)
            return
        w = self.layout.worker_of(msg.src)
        if w is None:
            state.reject_message("message from a non-worker rank")
            return
        if msg.header.worker != w:
            state.reject_message("header names another worker than its sender")
            return
        t = self.now()
        self.last_heard[w] = t
        self.deliver(state.handle(w, msg.header, msg.tensors))
        dead = sorted(a for a in self.watched() if t - self.last_heard[a] > self.timeout_s)
        if dead:
            self.lose(dead, f"silent for more than {self.timeout_s:g} s")

    def watched(self) -> set[int]:
        """Workers whose silence means death (without heartbeats, one whose pull we hold
        back is silent by our doing)."""
        state = self.state
        return state.active if self.heartbeats else state.active - state.waiting

    def timed_out(self) -> None:
        silent = sorted(self.watched())
        if not self.heartbeats:
            self.on_worker_loss = "stop"  # a held-back worker might still be alive
        # the timed-out receive stays posted: nothing more can be received on this
        # channel, so this ends the loop either way (FINALs use the control channel)
        self.lose(silent, f"sent nothing for {self.timeout_s:g} s (no message at all)")

    def lose(self, workers: list[int], why: str) -> None:
        state = self.state
        if self.on_worker_loss != "continue":
            raise PhalanxError(f"parameter server shard {state.shard}: worker(s) {workers} "
                               f"{why}; presumed dead") from None
        for w in workers:
            if w not in state.active:  # already dropped (a lost host breaks several pairs)
                continue
            state.log_worker_lost(w, why)
            self.transport.forget({self.layout.worker_rank(w)})  # its replies in flight
            self.deliver(state.drop_worker(w))

    def deliver(self, outs: list[Outgoing]) -> None:
        t = self.now()
        for out in outs:
            try:
                self.transport.send(self.layout.worker_rank(out.worker), out.header,
                                    out.tensors)
            except PeerLost as e:
                self.lost_worker(e)
            self.last_heard[out.worker] = t  # its silence while we held it back was our doing
        if self.state.version != self.version:
            self.version = self.state.version
            if self.after_update is not None:
                self.after_update(self.state)

    def lost_worker(self, e: PeerLost) -> None:
        w = self.layout.worker_of(e.rank) if e.rank is not None else None
        if self.heartbeats and e.rank is None:
            # a receive from any source failed because some peer's connection broke; gloo
            # does not say whose. The other pairs keep working (measured), and the dead
            # worker is the one whose heartbeats stop: it is named (and dropped, or the
            # run stopped) when its silence passes timeout_s. Bounded: a broken group
            # must not spin
            self.unnamed_losses += 1
            if self.unnamed_losses <= self.layout.workers:
                return
        if w is None:
            raise PhalanxError(f"parameter server shard {self.state.shard}: a peer process "
                               f"failed or exited ({e})") from None
        self.lose([w], "lost its connection")


def _counters(stats: ShardStats, counter: ByteCounter, extra_sent: int = 0) -> list[float]:
    values = {"pushes_applied": stats.pushes_applied, "pushes_rejected": stats.pushes_rejected,
              "messages_rejected": stats.messages_rejected, "updates": stats.updates,
              "bytes_sent": counter.sent + extra_sent, "bytes_received": counter.received,
              "pushes_lost": stats.pushes_lost, "duplicates": stats.duplicates,
              "workers_lost": stats.workers_lost, "pull_resyncs": stats.pull_resyncs}
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
    transport.flush(lost={layout.worker_rank(w) for w in state.lost_workers})


def gather_final(state: ShardState, transport: Transport, layout: Layout,
                 timeout_s: float) -> list[ShardResult]:
    """Server 0 collects every shard's FINAL message (its own state included), on the
    control channel."""
    results = {0: ShardResult(0, state.dense, state.rows,
                              _counters(state.stats, transport.counter), state.worker_stats)}
    while len(results) < layout.servers:
        try:
            msg = transport.recv(timeout_s=timeout_s, control=True)
        except TransportTimeout:
            missing = sorted(set(range(layout.servers)) - set(results))
            raise PhalanxError(f"parameter server 0: shard(s) {missing} never sent their "
                               f"parameters ({timeout_s:g} s)") from None
        except WireError as e:
            state.reject_message(f"bad header: {e}")
            continue
        except PeerLost as e:
            raise PhalanxError(f"parameter server 0: a shard failed before sending its "
                               f"parameters ({e})") from None
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
