"""The worker side of the parameter server: pull parameters from, and push gradients to,
every shard. A worker's clock is the number of pushes it has made.

Requests go to all shards first and replies are collected afterwards, so the shards work
in parallel and a slow shard costs one wait, not S.

While a worker runs, a :class:`Heartbeat` thread tells every shard it is alive, so a shard
can tell a worker that is busy (or held back at a barrier) from one that died. Pushes carry
their sequence number (the clock) in ``seq``; a :class:`~phalanx.runtime.faults.MessageDropper`
may lose some of them on purpose (``--drop-messages``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING

import torch

from phalanx.comm.compress import CODEC_MASK, DecodeError, checksum, decode_payload
from phalanx.comm.transport import PeerLost, Transport, TransportTimeout
from phalanx.comm.wire import Header, Kind, WireError
from phalanx.errors import PhalanxError
from phalanx.ps.partition import Partition
from phalanx.ps.server import Layout
from phalanx.ps.shard import CHECKED, HAS_ROWS, RESUME, SKIPPED, WANT_DENSE
from phalanx.runtime.faults import MessageDropper

if TYPE_CHECKING:
    from phalanx.comm.exchange import Compression

LOST_PEER_GRACE_S = 5.0
# every CHECK_EVERY-th compressed pull carries the CRC-32 of the worker's copy (one pass
# over the slice on each side, against the O(n) decode every pull does anyway)
CHECK_EVERY = 16


class PSClient:
    def __init__(self, transport: Transport, part: Partition, layout: Layout, worker: int,
                 timeout_s: float | None = None, dropper: MessageDropper | None = None) -> None:
        self.transport, self.part, self.layout, self.worker = transport, part, layout, worker
        self.timeout_s = timeout_s
        self.dropper = dropper
        self.versions = [0] * part.shards  # each shard's version at our last pull
        self.server_clocks = [0] * part.shards  # our clock as each shard knew it then
        self.left: set[int] = set()  # shards that answered a resume pull with LEFT
        self.compression: Compression | None = None  # --compress: pushes and pulls
        self.check_every = CHECK_EVERY
        self.pulls_asked = 0  # compressed dense pulls asked for (the checksum's cadence)

    def pull(self, clock: int, dense_out: torch.Tensor | None = None,
             rows: torch.Tensor | None = None, table_out: torch.Tensor | None = None,
             resume: bool = False) -> None:
        """Fetch the dense parameters into ``dense_out`` (flat, all shards) and the table rows
        ``rows`` into ``table_out``. May block: the consistency model decides when the
        shards answer (this is the synchronisation point of BSP and SSP). ``resume``: a
        restarted worker does not know its clock; each shard's answer tells it
        (:attr:`server_clocks`)."""
        asked = self.request(clock, dense_out is not None, rows, resume, held=dense_out)
        self.collect(asked, dense_out, table_out)

    def request(self, clock: int, dense: bool = True, rows: torch.Tensor | None = None,
                resume: bool = False, held: torch.Tensor | None = None) -> list:
        """Send the PULL requests of :meth:`pull` and return what :meth:`collect` needs
        to receive the answers. Between the two a worker may compute (a pull ahead).
        ``held``: the dense parameters this worker holds (every earlier answer applied),
        whose slices' checksums every :attr:`check_every`-th compressed pull carries."""
        per_shard = self.part.split_rows(rows) if rows is not None else None
        check = False
        if dense and self.compression is not None and held is not None and not resume:
            self.pulls_asked += 1
            check = self.pulls_asked % self.check_every == 0
        asked = []
        for k in range(self.part.shards):
            ids = per_shard[k] if per_shard is not None else None
            want_dense = dense and self.part.dense_range(k)[1] > self.part.dense_range(k)[0]
            if not want_dense and (ids is None or not ids.numel()):
                continue
            flags = (WANT_DENSE if want_dense else 0) | (HAS_ROWS if ids is not None else 0)
            flags |= RESUME if resume else 0
            tensors = [ids] if ids is not None else []
            if want_dense and self.compression is not None:
                flags |= self.compression.flags  # answer with a compressed delta
                if check:  # is my copy still the one the shard deltas against?
                    a, b = self.part.dense_range(k)
                    tensors.append(torch.tensor([checksum(held[a:b])], dtype=torch.int64))
                    flags |= CHECKED
            self.transport.send(self.layout.server_rank(k),
                                Header(Kind.PULL, worker=self.worker, clock=clock, shard=k,
                                       flags=flags), tensors)
            asked.append((k, want_dense, ids))
        return asked

    def collect(self, asked: list, dense_out: torch.Tensor | None = None,
                table_out: torch.Tensor | None = None) -> None:
        """Receive the answers to :meth:`request` (blocks until every shard answered)."""
        for (k, want_dense, ids), msg in zip(asked, self._recv_all([k for k, _, _ in asked])):
            h, t = msg.header, msg.tensors
            if h.kind == Kind.LEFT and h.shard == k and h.worker == self.worker and not t:
                self.left.add(k)  # this worker was dropped before the run stopped
                continue
            a, b = self.part.dense_range(k)
            delta = want_dense and bool(h.flags & CODEC_MASK)
            ok = (h.kind == Kind.PARAMS and h.shard == k and h.worker == self.worker
                  and len(t) == 1 + (ids is not None)
                  and (delta or t[0].numel() == ((b - a) if want_dense else 0)))
            if ok and ids is not None:
                ok = t[1].numel() == ids.numel() * self.part.table.dim
            if not ok:
                raise PhalanxError(f"worker {self.worker}: shard {k} answered a pull with a "
                                   "malformed message")
            if delta:
                try:
                    dense_out[a:b] += decode_payload(h.flags, t[0], b - a)
                except DecodeError as e:
                    raise PhalanxError(f"worker {self.worker}: shard {k} answered a pull with a "
                                       f"bad compressed delta ({e})") from None
            elif want_dense:
                dense_out[a:b] = t[0]
            if ids is not None and ids.numel():
                table_out[ids] = t[1].view(-1, self.part.table.dim).to(table_out.device,
                                                                       table_out.dtype)
            self.versions[k] = h.version
            self.server_clocks[k] = h.clock

    def push(self, clock: int, dense_grad: torch.Tensor, versions: list[int] | None = None,
             rows: torch.Tensor | None = None, row_grads: torch.Tensor | None = None,
             pull: bool = False) -> list:
        """Send each shard its slice of the gradient (and its rows' gradients). No reply:
        the next pull from a shard is answered after this push (per-pair order).

        ``pull``: each push also asks for the dense slice the next step trains on (a
        PUSH_PULL: the pull sent with the push); returns what :meth:`collect` needs to
        receive the answers. Only for dense, uncompressed, lossless pushes."""
        if pull and (rows is not None or self.compression is not None
                     or self.dropper is not None):
            raise ValueError("a push with its pull: dense, uncompressed and lossless only")
        asked = []
        versions = versions if versions is not None else self.versions
        per_shard = self.part.split_rows(rows) if rows is not None else None
        for k in range(self.part.shards):
            a, b = self.part.dense_range(k)
            tensors = [dense_grad[a:b]]
            flags = 0
            if self.compression is not None:  # error feedback per shard; rand-k seeded
                t = self.compression.encode(dense_grad[a:b], key=k,
                                            seed=clock * self.part.shards + k)
                tensors, flags = ([t], self.compression.flags) if t is not None else ([], SKIPPED)
            # SKIPPED (NaN / inf; counted in compression.screened): nothing is sent but the
            # notice, which the shard counts as the rejected push it replaces
            if per_shard is not None and not flags & SKIPPED:
                mask = self.part.owner(rows) == k
                tensors += [per_shard[k], row_grads[mask]]
                flags |= HAS_ROWS
            if self.dropper is not None and self.dropper.drop():
                continue  # a lossy link: the shard will see the gap in the sequence numbers
            with_pull = pull and b > a
            self.transport.send(self.layout.server_rank(k),
                                Header(Kind.PUSH_PULL if with_pull else Kind.PUSH,
                                       worker=self.worker, clock=clock, version=versions[k],
                                       shard=k, seq=clock, flags=flags), tensors)
            if with_pull:
                asked.append((k, True, None))
        return asked

    def done(self, clock: int, stats: torch.Tensor, extra: list[torch.Tensor] = ()) -> None:
        """Tell every shard this worker is finished (with its counters for the summary)."""
        for k in range(self.part.shards):
            self.transport.send(self.layout.server_rank(k),
                                Header(Kind.DONE, worker=self.worker, clock=clock, shard=k),
                                [stats, *extra] if k == 0 else [stats])
        self.transport.flush()

    def _recv_all(self, shards: list[int]) -> list:
        """One message from each shard, every answer's payload in flight at once where the
        transport can (:meth:`GlooTransport.recv_from`)."""
        many = getattr(self.transport, "recv_from", None)
        if many is None or len(shards) < 2:
            return [self._recv(k) for k in shards]
        ranks = {self.layout.server_rank(k): k for k in shards}
        with self._named(ranks):
            return many(list(ranks), timeout_s=self.timeout_s)

    def _recv(self, k: int):
        rank = self.layout.server_rank(k)
        with self._named({rank: k}):
            return self.transport.recv(src=rank, timeout_s=self.timeout_s)

    @contextlib.contextmanager
    def _named(self, ranks: dict[int, int]):
        """A receive from the shards ``ranks`` maps from their ranks: its failure as one
        error naming the shard (the failure's rank where it has one, else the only one)."""
        try:
            yield
        except (TransportTimeout, WireError, PeerLost) as e:
            k = ranks.get(getattr(e, "rank", None), next(iter(ranks.values())))
            if isinstance(e, TransportTimeout):
                raise PhalanxError(f"worker {self.worker}: parameter server shard {k} did not "
                                   f"answer in {self.timeout_s:g} s") from None
            if isinstance(e, WireError):
                raise PhalanxError(f"worker {self.worker}: bad message from shard {k}: {e}") \
                    from None
            # the shard died; it (or the worker that made it give up) reports the cause.
            # Waiting a moment lets that error reach the launcher first, instead of ours.
            time.sleep(LOST_PEER_GRACE_S)
            raise PhalanxError(f"worker {self.worker}: lost the connection to parameter "
                               f"server shard {k} (it failed or exited)") from None


class Heartbeat:
    """A daemon thread that sends HEARTBEAT to every shard every ``interval_s`` seconds
    until :meth:`stop`. It ends quietly when a send fails: the training loop, blocked or
    not, finds out about a dead server by itself and reports it."""

    def __init__(self, transport: Transport, layout: Layout, worker: int,
                 interval_s: float) -> None:
        self.transport, self.layout, self.worker = transport, layout, worker
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{worker}",
                                        daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                for k in range(self.layout.servers):
                    self.transport.send(self.layout.server_rank(k),
                                        Header(Kind.HEARTBEAT, worker=self.worker, shard=k))
            except (PeerLost, RuntimeError):
                return
