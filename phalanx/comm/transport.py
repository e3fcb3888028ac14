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

Over gloo a message travels as one *frame* where it can: ``[frame bytes][header][payloads,
each padded to 8 bytes]``, received into a buffer posted before it was sent. gloo sends a
message only once its receive is posted, so a payload received after its header (the frame
``[0][header]``, then each payload tensor) costs one more round trip, and on a shard's busy
links that round trip queues behind the other peers' transfers (bench/ps_async_shaped.py:
1.13x plain gloo's step with the payload after its header, docs/parameter-server.md). A
receive buffer must not be smaller than what arrives (gloo aborts the process), so each
side keeps, per peer and channel, the capacity a receive is posted with: both start at
:data:`FRAME_START`, both grow to the largest frame the pair has moved (at most
:data:`FRAME_MAX`), and a sender sends a frame whole only if it fits. A receiver that meets
a frame it cannot trust posts :data:`FRAME_MAX` from then on, never less than its sender.
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
from phalanx.comm.wire import DTYPES, HEADER_BYTES, HEADER_LEN, Header, Kind, WireError, describe

HEADER_TAG = 7001  # frames, and payloads sent after their header, travel on separate tags
PAYLOAD_TAG = 7002  # so a receive from "any source" only ever matches a frame
CONTROL_TAG = 7003  # frames of FINAL messages (the control channel)
FRAME_START = 1 << 20  # bytes a receive is first posted with (untouched pages cost nothing)
FRAME_MAX = 64 << 20  # larger messages send their payload after the header
_PREFIX_LEN = 1  # int64 words before the header: the frame's bytes, 0 if its payload follows


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
        # (tag, peer) -> the largest frame this side sends whole / posts a receive with
        self._send_cap: dict[tuple[int, int], int] = {}
        self._recv_cap: dict[tuple[int, int], int] = {}
        self._cap_lock = threading.Lock()  # receiver threads grow their peers' capacities

    def send(self, dst: int, header: Header, tensors: Sequence[torch.Tensor] = ()) -> None:
        import torch.distributed as dist

        if not 0 <= dst < self.world or dst == self.rank:
            raise ValueError(f"rank {self.rank}: cannot send to rank {dst}")
        header, flat = _with_payload(header, tensors)
        wire = header.encode()
        tag = CONTROL_TAG if _is_control(header) else HEADER_TAG
        size = frame_bytes(header)
        with self._lock:
            cap = self._send_cap.get((tag, dst), FRAME_START)
            whole = size <= cap  # the receive the peer posts for it holds it
            frame = pack_frame(wire, flat if whole else None)
            try:
                works = [dist.isend(frame, dst, tag=tag)]
                if not whole:
                    works += [dist.isend(t, dst, tag=PAYLOAD_TAG) for t in flat]
            except RuntimeError as e:  # gloo refuses at once a send to a known-dead peer
                first = _first_line(e)
                raise PeerLost(f"rank {self.rank}: a send to rank {dst} failed "
                               f"({_short(first)})", rank=dst) from None
            self._send_cap[(tag, dst)] = min(FRAME_MAX, max(cap, size))
            self._inflight.append((dst, works, [frame] if whole else [frame, *flat]))
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
            cap = self._cap(tag, src)
            buf = torch.empty(cap // 8, dtype=torch.int64)
            try:
                # posting fails too once a pair broke with a reset (a host lost at once)
                work = dist.irecv(buf, src=src, tag=tag)
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
        # a bad header: nothing reliable says what follows it (WireError)
        header, tensors = self._open(sender, tag, buf, cap)
        try:
            if tensors is None:  # its payload follows
                tensors = header.payload_buffers()
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
        """One message from each of ``srcs`` (returned in that order), in flight at once:
        every frame's receive is posted before any is waited for, and a payload that
        follows its header has its receive posted as soon as that header is in (a worker's
        pull answered by S shards: one after another, shard 0's answer to two workers went
        at half speed to each while shard 1's waited)."""
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
        caps = [self._cap(HEADER_TAG, s) for s in srcs]
        bufs = [torch.empty(cap // 8, dtype=torch.int64) for cap in caps]
        heads = [self._post(buf, s, HEADER_TAG) for buf, s in zip(bufs, srcs)]
        out, payloads = [], []
        for s, work, buf, cap in zip(srcs, heads, bufs, caps):
            self._wait_one(work, s, timeout_s)
            try:
                header, tensors = self._open(s, HEADER_TAG, buf, cap)
            except WireError as e:
                e.rank = s
                raise
            if tensors is None:  # its payload follows
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

    def _cap(self, tag: int, src: int | None) -> int:
        """The bytes to post a receive from ``src`` with (None: from any peer, the most)."""
        with self._cap_lock:
            if src is not None:
                return self._recv_cap.get((tag, src), FRAME_START)
            return max([FRAME_START] + [c for (t, _), c in self._recv_cap.items() if t == tag])

    def _open(self, peer: int, tag: int, buf: torch.Tensor, cap: int
              ) -> tuple[Header, list[torch.Tensor] | None]:
        """The header of the frame received from ``peer`` into ``buf`` (posted with ``cap``
        bytes), and its payload, or None where the payload follows. A frame that fails
        :meth:`Header.decode` or whose length is not its header's raises WireError, and
        this side posts :data:`FRAME_MAX` for that peer from then on (what the peer
        counted it as is unknown)."""
        try:
            header = Header.decode(buf[_PREFIX_LEN:_PREFIX_LEN + HEADER_LEN])
            size, length = frame_bytes(header), int(buf[0])
            if length not in (0, size) or (length and size > cap):
                raise WireError(f"frame length {length} does not match its header's {size}")
        except WireError:
            with self._cap_lock:
                self._recv_cap[(tag, peer)] = FRAME_MAX
            raise
        with self._cap_lock:
            key = (tag, peer)
            self._recv_cap[key] = min(FRAME_MAX, max(self._recv_cap.get(key, FRAME_START), size))
        if not length:
            return header, None
        return header, unpack_frame(header, buf, copy=4 * size < cap)

    def _whole(self, sender: int, item: tuple[Header, list[torch.Tensor]]) -> Message:
        """A message a receiver thread took whole, its payload too."""
        header, tensors = item
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
        if isinstance(item, WireError):
            raise item  # a bad frame: the next receive reads a frame again
        if isinstance(item, BaseException):
            self._dead.add(peer)
            first = _first_line(item)
            raise PeerLost(f"rank {self.rank}: connection to rank {peer} lost "
                           f"({_short(first)})", rank=peer)
        return peer, item

    def _listen(self, tag: int, peer: int, arrived: queue.Queue) -> None:
        import torch.distributed as dist

        while True:
            cap = self._cap(tag, peer)
            buf = torch.empty(cap // 8, dtype=torch.int64)
            try:
                dist.irecv(buf, src=peer, tag=tag).wait()
                try:
                    header, tensors = self._open(peer, tag, buf, cap)
                except WireError as e:
                    # nothing reliable says what follows a bad frame: the caller rejects
                    # it; the next receive reads a frame again
                    arrived.put((peer, e))
                    continue
                if tensors is None:  # its payload follows
                    tensors = header.payload_buffers()
                    for t in tensors:
                        dist.irecv(t, src=peer, tag=PAYLOAD_TAG).wait()
            except RuntimeError as e:
                arrived.put((peer, e))
                return
            arrived.put((peer, (header, tensors)))
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


def _pad(n: int) -> int:
    return (n + 7) & ~7


def frame_bytes(header: Header) -> int:
    """The bytes of ``header``'s message as one frame: its prefix, the header, and each
    payload tensor padded to 8 bytes."""
    return 8 * (_PREFIX_LEN + HEADER_LEN) + sum(
        _pad(numel * DTYPES[code].itemsize) for code, numel in header.payload)


def pack_frame(wire: torch.Tensor, flat: Sequence[torch.Tensor] | None) -> torch.Tensor:
    """One int64 tensor to send: ``[bytes][header][payloads]``, or ``[0][header]`` when
    ``flat`` is None (the payload is sent after it)."""
    if flat is None:
        return torch.cat([torch.zeros(_PREFIX_LEN, dtype=torch.int64), wire])
    start = 8 * (_PREFIX_LEN + HEADER_LEN)
    size = start + sum(_pad(t.numel() * t.element_size()) for t in flat)
    frame = torch.empty(size // 8, dtype=torch.int64)
    frame[0] = size
    frame[_PREFIX_LEN:_PREFIX_LEN + HEADER_LEN] = wire
    raw, at = frame.view(torch.uint8), start
    for t in flat:
        n = t.numel() * t.element_size()
        raw[at:at + n].view(t.dtype).copy_(t)
        raw[at + n:at + _pad(n)] = 0
        at += _pad(n)
    return frame


def unpack_frame(header: Header, frame: torch.Tensor, copy: bool) -> list[torch.Tensor]:
    """The payload tensors of a whole frame: views of it, or copies (``copy``: a small
    message in a large receive buffer does not keep the buffer alive)."""
    raw, at, out = frame.view(torch.uint8), 8 * (_PREFIX_LEN + HEADER_LEN), []
    for code, numel in header.payload:
        dtype = DTYPES[code]
        n = numel * dtype.itemsize
        t = raw[at:at + n].view(dtype)
        out.append(t.clone() if copy else t)
        at += _pad(n)
    return out


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
