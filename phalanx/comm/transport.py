"""Point-to-point message transports with one interface:

* :class:`GlooTransport` — real processes, ``torch.distributed`` send/recv over gloo;
* :class:`InProcTransport` — threads in one process (queues), so the parameter server
  and consistency logic are tested deterministically without processes.

A message is a :class:`~phalanx.comm.wire.Header` plus payload tensors. Both transports
encode the header to its int64 wire form and decode (validate) it on receipt, so the
in-process tests exercise the same wire code. Every message is counted in bytes.

Two channels: FINAL messages (server -> server 0 at the end of a run) travel on their own
*control* channel, received with ``recv(control=True)``. A gloo receive that timed out
stays posted and would swallow the next header on its tag, so after a timeout on the
worker channel a server can still collect its peers' FINAL messages.
"""

from __future__ import annotations

import datetime
import queue
import threading
import time
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from phalanx.comm.counters import ByteCounter, nbytes
from phalanx.comm.wire import HEADER_BYTES, HEADER_LEN, Header, Kind, WireError, describe

HEADER_TAG = 7001  # headers and payloads travel on separate tags so that a receive from
PAYLOAD_TAG = 7002  # "any source" only ever matches a header, never someone's payload
CONTROL_TAG = 7003  # headers of FINAL messages (the control channel)


class TransportTimeout(TimeoutError):
    """Nothing arrived within the timeout (``rank``: from that peer, when one was named)."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


class PeerLost(ConnectionError):
    """The connection to a peer broke (the peer process failed or exited). ``rank`` is
    the peer when it is known (a failed send, or a payload cut off mid-message)."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


@dataclass
class Message:
    src: int
    header: Header
    tensors: list[torch.Tensor] = field(default_factory=list)


class Transport(Protocol):
    rank: int
    counter: ByteCounter

    def send(self, dst: int, header: Header, tensors: Sequence[torch.Tensor] = ()) -> None: ...

    def recv(self, src: int | None = None, timeout_s: float | None = None, *,
             control: bool = False) -> Message: ...

    def flush(self, lost: Collection[int] = ()) -> None: ...

    def forget(self, lost: Collection[int]) -> None: ...


def _is_control(header: Header) -> bool:
    return header.kind == Kind.FINAL


def _with_payload(header: Header, tensors: Sequence[torch.Tensor]) -> tuple[Header, list]:
    flat = [t.detach().reshape(-1).contiguous() for t in tensors]
    return Header(header.kind, header.worker, header.clock, header.version, header.shard,
                  header.seq, header.flags, describe(flat)), flat


# ---- in-process: one mailbox per rank ---------------------------------------------------


class InProcNetwork:
    """Mailboxes of ``world`` in-process ranks; build one transport per rank with
    :meth:`transport`. Messages between a pair arrive in the order they were sent."""

    def __init__(self, world: int) -> None:
        self.world = world
        self._boxes: list[deque] = [deque() for _ in range(world)]
        self._cond = threading.Condition()

    def transport(self, rank: int) -> InProcTransport:
        return InProcTransport(self, rank)

    def _put(self, dst: int, item: tuple) -> None:
        with self._cond:
            self._boxes[dst].append(item)
            self._cond.notify_all()

    def _take(self, rank: int, src: int | None, timeout_s: float | None,
              control: bool = False) -> tuple:
        box = self._boxes[rank]
        with self._cond:
            while True:
                for i, item in enumerate(box):
                    if (src is None or item[0] == src) and item[3] == control:
                        del box[i]
                        return item
                if not self._cond.wait(timeout_s):
                    raise TransportTimeout(f"rank {rank}: nothing arrived in {timeout_s} s")

    def pending(self, rank: int) -> int:
        with self._cond:
            return len(self._boxes[rank])


class InProcTransport:
    def __init__(self, network: InProcNetwork, rank: int) -> None:
        self.network, self.rank = network, rank
        self.counter = ByteCounter()

    def send(self, dst: int, header: Header, tensors: Sequence[torch.Tensor] = ()) -> None:
        if not 0 <= dst < self.network.world:
            raise ValueError(f"no rank {dst}")
        header, flat = _with_payload(header, tensors)
        wire = header.encode()
        # clone: the receiver must not see later in-place changes of the sender's tensors
        self.network._put(dst, (self.rank, wire, [t.clone() for t in flat], _is_control(header)))
        self.counter.on_send(HEADER_BYTES + nbytes(*flat))

    def send_raw(self, dst: int, wire: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
        """Send an arbitrary header tensor (tests of the receiver's validation)."""
        self.network._put(dst, (self.rank, wire.clone(), [t.clone() for t in tensors], False))

    def recv(self, src: int | None = None, timeout_s: float | None = None, *,
             control: bool = False) -> Message:
        sender, wire, tensors, _ = self.network._take(self.rank, src, timeout_s, control)
        self.counter.on_recv(wire.numel() * wire.element_size() + nbytes(*tensors))
        header = Header.decode(wire)  # raises WireError; the payload is dropped with it
        got = [(t.dtype, t.numel()) for t in tensors]
        want = [(b.dtype, b.numel()) for b in header.payload_buffers()]
        if got != want:
            raise WireError("payload does not match what the header announced")
        return Message(sender, header, list(tensors))

    def flush(self, lost: Collection[int] = ()) -> None:
        pass

    def forget(self, lost: Collection[int]) -> None:
        pass


# ---- real processes: torch.distributed point-to-point over gloo ---------------------------


class GlooTransport:
    """Messages over the default (gloo) process group.

    Sends are ``isend``: a process never blocks on a send, so two processes sending to
    each other at the same time cannot deadlock. The tensors of an in-flight send are kept
    alive until it completes (:meth:`flush` waits for all of them). Sends may come from
    two threads (a worker's heartbeat thread and its training loop): a lock keeps the
    bookkeeping whole. A receive from any source keeps working after a peer died (measured:
    gloo fails only the pair to the dead peer), so survivors go on talking.
    """

    def __init__(self, rank: int, world: int, *, concurrent: Collection[int] = ()) -> None:
        self.rank, self.world = rank, world
        # ``concurrent`` (a parameter server's shards: the workers' ranks): a receive from
        # any source takes whole messages from a thread per one of these peers, so that
        # every peer's payload is in flight at once. Taken one after another, a payload
        # leaves its sender only once the receiver asks for it (gloo's rendezvous): two
        # shards that both took worker 0's header first pulled its link's bytes at half
        # speed each while worker 1's link idled (bench/ps_shaped.py: 1.377x plain gloo's
        # round one after another, 1.006x at once). A peer's thread ends with its DONE
        # (its last message), so none outlives the run.
        self.concurrent = frozenset(concurrent)
        self.counter = ByteCounter()
        self._inflight: list[tuple[int, list, list[torch.Tensor]]] = []
        self._lock = threading.Lock()
        self._broken = False  # a pair broke: receives from any source go through threads
        self._dead: set[int] = set()
        self._listening: set[tuple[int, int]] = set()  # (tag, peer) with a receiver thread
        self._arrived: dict[int, queue.Queue] = {}  # tag -> (peer, header or error)
        # what a receiver thread took while the caller waited for another peer on that tag
        self._stash: dict[int, list[tuple[int, Any]]] = {}

    def send(self, dst: int, header: Header, tensors: Sequence[torch.Tensor] = ()) -> None:
        import torch.distributed as dist

        if not 0 <= dst < self.world or dst == self.rank:
            raise ValueError(f"rank {self.rank}: cannot send to rank {dst}")
        header, flat = _with_payload(header, tensors)
        wire = header.encode()
        tag = CONTROL_TAG if _is_control(header) else HEADER_TAG
        with self._lock:
            try:
                works = [dist.isend(wire, dst, tag=tag)]
                works += [dist.isend(t, dst, tag=PAYLOAD_TAG) for t in flat]
            except RuntimeError as e:  # gloo refuses at once a send to a known-dead peer
                first = _first_line(e)
                raise PeerLost(f"rank {self.rank}: a send to rank {dst} failed "
                               f"({_short(first)})", rank=dst) from None
            self._inflight.append((dst, works, [wire, *flat]))
            self.counter.on_send(HEADER_BYTES + nbytes(*flat))
            if len(self._inflight) > 64:
                # gloo completes a send only inside wait(); waiting on the oldest sends
                # bounds the memory held by in-flight tensors (posted long ago: cheap)
                old, self._inflight = self._inflight[:-16], self._inflight[-16:]
                self._wait(old)

    def _wait(self, inflight: list) -> None:
        """Wait for every send in ``inflight``; a failed one raises PeerLost naming its
        destination, after all the others were waited for (none is left half-tracked)."""
        lost = None
        for dst, works, _ in inflight:
            try:
                for w in works:
                    w.wait()
            except RuntimeError as e:
                first = _first_line(e)
                lost = lost or (dst, first)
        if lost is not None:
            raise PeerLost(f"rank {self.rank}: a send to rank {lost[0]} failed "
                           f"({_short(lost[1])})", rank=lost[0])

    def recv(self, src: int | None = None, timeout_s: float | None = None, *,
             control: bool = False) -> Message:
        import torch.distributed as dist

        tag = CONTROL_TAG if control else HEADER_TAG
        if src is None and (self._broken or (self.concurrent and not control)):
            return self._whole(*self._recv_each(
                tag, timeout_s, None if self._broken else self.concurrent))
        if src is not None and (tag, src) in self._listening:
            # a receiver thread already waits on this peer and tag: a second receive posted
            # here would race it for the message, so take the thread's
            return self._whole(src, self._take_from(tag, src, timeout_s))
        else:
            wire = torch.empty(HEADER_LEN, dtype=torch.int64)
            try:
                # posting fails too once a pair broke with a reset (a host lost at once)
                work = dist.irecv(wire, src=src, tag=tag)
                _wait_for(work, timeout_s)
            except RuntimeError as e:
                first = _first_line(e)
                if "Timed out" not in first:
                    # gloo's receive from any source fails on every later call once one
                    # pair is broken: from now on receive from each live peer separately
                    self._broken = self._broken or src is None
                    raise PeerLost(f"rank {self.rank}: connection lost ({_short(first)})",
                                   rank=src) from None
                # a timed-out gloo receive stays posted and cannot be re-waited: callers
                # must treat TransportTimeout as the end of the run (dead peer)
                raise TransportTimeout(
                    f"rank {self.rank}: nothing arrived in {timeout_s} s") from None
            sender = src if src is not None else work._source_rank()
        header = Header.decode(wire)  # a bad header: nothing reliable says what follows it
        tensors = header.payload_buffers()
        try:
            for t in tensors:
                dist.recv(t, src=sender, tag=PAYLOAD_TAG)
        except RuntimeError as e:
            first = _first_line(e)
            raise PeerLost(f"rank {self.rank}: connection to rank {sender} lost "
                           f"({_short(first)})", rank=sender) from None
        self.counter.on_recv(HEADER_BYTES + nbytes(*tensors))
        return Message(sender, header, tensors)

    def recv_from(self, srcs: Sequence[int], timeout_s: float | None = None
                  ) -> list[Message]:
        """One message from each of ``srcs`` (returned in that order), their payloads in
        flight at once: each payload's receive is posted as soon as its header is in (a
        worker's pull answered by S shards: one after another, shard 0's answer to two
        workers went at half speed to each while shard 1's waited)."""
        if len(srcs) < 2 or self._broken or any((HEADER_TAG, s) in self._listening
                                                for s in srcs):
            out = []
            for s in srcs:
                try:
                    out.append(self.recv(s, timeout_s))
                except (TransportTimeout, WireError) as e:
                    e.rank = s  # whose message it was
                    raise
            return out
        wires = [torch.empty(HEADER_LEN, dtype=torch.int64) for _ in srcs]
        heads = [self._post(wire, s, HEADER_TAG) for wire, s in zip(wires, srcs)]
        out, payloads = [], []
        for s, work, wire in zip(srcs, heads, wires):
            self._wait_one(work, s, timeout_s)
            try:
                header = Header.decode(wire)
            except WireError as e:
                e.rank = s
                raise
            tensors = header.payload_buffers()
            payloads += [(s, self._post(t, s, PAYLOAD_TAG)) for t in tensors]
            out.append(Message(s, header, tensors))
        for s, work in payloads:
            self._wait_one(work, s, timeout_s)
        for m in out:
            self.counter.on_recv(HEADER_BYTES + nbytes(*m.tensors))
        return out

    def _post(self, buf: torch.Tensor, src: int, tag: int) -> Any:
        import torch.distributed as dist

        try:
            return dist.irecv(buf, src=src, tag=tag)
        except RuntimeError as e:
            first = _first_line(e)
            raise PeerLost(f"rank {self.rank}: connection to rank {src} lost "
                           f"({_short(first)})", rank=src) from None

    def _wait_one(self, work: Any, src: int, timeout_s: float | None) -> None:
        try:
            _wait_for(work, timeout_s)
        except RuntimeError as e:
            first = _first_line(e)
            if "Timed out" in first:
                raise TransportTimeout(f"rank {self.rank}: nothing arrived from rank {src} "
                                       f"in {timeout_s} s", rank=src) from None
            raise PeerLost(f"rank {self.rank}: connection to rank {src} lost "
                           f"({_short(first)})", rank=src) from None

    def _whole(self, sender: int, item: tuple[torch.Tensor, list | None]) -> Message:
        """A message a receiver thread took whole: its payload too, unless its header was
        bad (``tensors`` None), whose WireError the decode here raises, as a direct
        receive does."""
        wire, tensors = item
        header = Header.decode(wire)
        self.counter.on_recv(HEADER_BYTES + nbytes(*tensors))
        return Message(sender, header, tensors)

    def _recv_each(self, tag: int, timeout_s: float | None,
                   peers: Collection[int] | None = None) -> tuple[int, tuple]:
        """A receive from any LIVE peer (once a pair broke, or :attr:`concurrent`): a
        thread per peer blocks on a receive from that peer alone and queues each whole
        message (gloo completes a receive only inside ``wait``, and a timed-out one cannot
        be waited again, so polling is out). A failed receive names its peer, who is then
        left out."""
        arrived = self._arrived.setdefault(tag, queue.Queue())
        stash = self._stash.setdefault(tag, [])
        if stash:
            return self._unpack(*stash.pop(0))
        for peer in peers if peers is not None else range(self.world):
            if peer != self.rank and peer not in self._dead and (tag, peer) not in self._listening:
                self._listening.add((tag, peer))
                threading.Thread(target=self._listen, args=(tag, peer, arrived),
                                 daemon=True, name=f"recv-{peer}-{tag}").start()
        try:
            peer, item = arrived.get(timeout=timeout_s)
        except queue.Empty:
            raise TransportTimeout(f"rank {self.rank}: nothing arrived in {timeout_s} s") from None
        return self._unpack(peer, item)

    def _take_from(self, tag: int, src: int, timeout_s: float | None) -> tuple:
        """The next header from ``src`` that its receiver thread queued; what other peers'
        threads queue meanwhile is kept for later receives from any source."""
        stash = self._stash.setdefault(tag, [])
        for i, (peer, item) in enumerate(stash):
            if peer == src:
                del stash[i]
                return self._unpack(peer, item)[1]
        arrived = self._arrived[tag]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                peer, item = arrived.get(timeout=left)
            except queue.Empty:
                raise TransportTimeout(
                    f"rank {self.rank}: nothing arrived in {timeout_s} s") from None
            if peer == src:
                return self._unpack(peer, item)[1]
            stash.append((peer, item))

    def _unpack(self, peer: int, item: Any) -> tuple[int, tuple]:
        if isinstance(item, BaseException):
            self._dead.add(peer)
            first = _first_line(item)
            raise PeerLost(f"rank {self.rank}: connection to rank {peer} lost "
                           f"({_short(first)})", rank=peer)
        return peer, item

    @staticmethod
    def _listen(tag: int, peer: int, arrived: queue.Queue) -> None:
        import torch.distributed as dist

        while True:
            wire = torch.empty(HEADER_LEN, dtype=torch.int64)
            try:
                dist.irecv(wire, src=peer, tag=tag).wait()
                try:
                    header = Header.decode(wire)
                except WireError:
                    # nothing reliable says what follows a bad header: the caller decodes
                    # it again and rejects it; the next receive reads a header again
                    arrived.put((peer, (wire, None)))
                    continue
                tensors = header.payload_buffers()
                for t in tensors:
                    dist.irecv(t, src=peer, tag=PAYLOAD_TAG).wait()
            except RuntimeError as e:
                arrived.put((peer, e))
                return
            arrived.put((peer, (wire, tensors)))
            if header.kind == Kind.DONE:
                return  # a worker's last message to a shard

    def flush(self, lost: Collection[int] = ()) -> None:
        """Wait for every send still in flight. ``lost``: ranks already known dead (a
        parameter server's dropped workers): a send to one of them that failed is not an
        error (it was a reply posted before the peer died)."""
        with self._lock:
            inflight, self._inflight = self._inflight, []
            # a send to a dead peer is not waited for (it could only fail, or block until
            # the group's timeout); the backend keeps its buffer until it gives up
            self._wait([s for s in inflight if s[0] not in lost])

    def forget(self, lost: Collection[int]) -> None:
        """Stop tracking the sends still in flight to ``lost`` (ranks just found dead: a
        parameter server's dropped workers). Waiting on one could only fail, or block until
        the group's timeout, and ``send`` waits on the oldest sends as more are posted: a
        server that went on answering its live workers after losing a host once stopped
        answering them 0.16 s later (the survivor gave up after 20 s)."""
        with self._lock:
            self._inflight = [s for s in self._inflight if s[0] not in lost]
            self._dead.update(lost)


def _first_line(e: BaseException) -> str:
    """The first line of an exception's message, or its type's name."""
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _wait_for(work: Any, timeout_s: float | None) -> None:
    """Wait on a gloo receive, at most ``timeout_s`` (None: for good)."""
    if timeout_s is None:
        work.wait()
    else:
        work.wait(datetime.timedelta(seconds=timeout_s))


def _short(gloo_message: str) -> str:
    """gloo's message without its source-file prefix and its advice."""
    text = gloo_message.split("] ", 1)[-1]
    return text.split(". This is typically", 1)[0]
