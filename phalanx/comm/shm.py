"""Point-to-point messages through shared memory, for ranks on one host (``--transport shm``).

Same interface and message format as :class:`~phalanx.comm.transport.GlooTransport`: a
fixed int64 :class:`~phalanx.comm.wire.Header`, then the payload tensors it announces,
validated on receipt, never unpickled. What changes is the road:

* **A ring per (sender, receiver, channel)**: a file in the run's folder under
  ``/dev/shm``, mapped by both and unlinked by the second to map it, so its memory goes
  with the two processes even when nobody is left to clean up (a ``kill -9`` of the
  launcher takes its ranks with it). The sender copies a whole *frame* in and then publishes
  the new tail; the receiver copies it out and then publishes the new head. Head and tail
  are 8-byte aligned words on cache lines of their own, each written by one side only;
  x86 keeps stores in order, so a reader that sees a tail sees the bytes before it.
* **Payloads inline with their header**: a frame is ``[frame length, spill][header]
  [payloads, each padded to 8 bytes]``, one copy in and one copy out, no second message.
  A frame larger than half the ring *spills*: its payload goes to a one-off file the
  frame names (the receiver reads and unlinks it), so any size fits.
* **Wake-up by a pipe**: every rank reads a FIFO of its own; a sender writes one byte
  after publishing. A receiver sleeps in ``select`` only when every ring it reads is
  empty, so the byte is a wake-up, never the data.
* **Never blocking on a send**: a frame that does not fit the ring waits in a queue that
  a thread of the sender drains as the receiver frees space (per-pair order kept).
* **Rejection as on a socket**: a frame whose length is out of range, whose header fails
  :meth:`Header.decode`, or whose payload does not match what the header announced
  raises :class:`WireError` (the caller counts it) and is skipped; a length that cannot
  be trusted empties that ring (nothing reliable says where the next frame starts).
* **A peer's death**: every rank leaves its pid in the folder. A receive from one peer
  that has waited a while checks it; a peer whose process is gone and whose ring is
  drained raises :class:`PeerLost` naming it, once (gloo's broken pair). A receive from
  any source never does: as over gloo, a peer that exited (a worker after DONE) is no
  error there, and a dead worker is named by its heartbeats' silence.

The folder is the launcher's: it makes it (named after its pid, under ``/dev/shm``),
removes it on every exit, and a run after a ``kill -9`` of the launcher sweeps it
(:func:`phalanx.runtime.signals.make_run_tempdir`). What such a kill leaves there holds
(almost) no memory: the FIFOs, the pid files, a spill in flight, and the rings of pairs
that never talked (worker to worker: made by their receiver, sparse, never written).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import threading
import time
from collections import deque
from collections.abc import Collection, Sequence
from pathlib import Path

import torch

from phalanx.comm.counters import ByteCounter, nbytes
from phalanx.comm.transport import (
    Message,
    PeerLost,
    TransportTimeout,
    _is_control,
    _with_payload,
)
from phalanx.comm.wire import DTYPES, HEADER_BYTES, HEADER_LEN, Header, WireError
from phalanx.runtime.signals import pid_alive

SHM_ROOT = "/dev/shm"
SHM_PREFIX = "phalanx-shm-"
RING_BYTES = 8 << 20  # per (sender, receiver) data ring; frames above half of it spill
CONTROL_RING_BYTES = 1 << 16  # FINAL messages: their payloads spill
_META = 4096  # head at byte 0, tail at byte 64; the data after the first page
_HEAD, _TAIL = 0, 8  # word indexes
_PREFIX = 16  # frame length, spill number
_FRAME_MIN = _PREFIX + HEADER_BYTES
_CHECK_PEERS_S = 0.25  # how long a receive waits before it looks for dead peers
_SEND_POLL_S = 2e-4  # a full ring's queue looks for free space this often


def _pad(n: int) -> int:
    return (n + 7) & ~7


def _payload_bytes(header: Header) -> list[int]:
    return [numel * torch.empty(0, dtype=DTYPES[code]).element_size()
            for code, numel in header.payload]


def _open_shared(path: Path, size: int) -> mmap.mmap:
    """Map ``path``, creating it at ``size`` bytes (zeros) if nobody has: made under a
    temporary name and linked into place, so a peer never maps a half-made file. A ring
    has two sides (its sender and its receiver): the side that finds the file already
    there maps it second and unlinks it, so the memory lives only as long as the mappings
    and nothing is left in ``/dev/shm`` when both processes die, however they die."""
    second = True
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(fd, size)
        second = False
        try:
            os.link(tmp, path)
        except FileExistsError:  # the peer made it first: use theirs
            os.close(fd)
            fd = os.open(path, os.O_RDWR)
            second = True
        finally:
            os.unlink(tmp)
    try:
        if os.fstat(fd).st_size != size:
            raise WireError(f"shared-memory ring {path.name} has the wrong size")
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    if second:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return mm


class _Ring:
    """One direction of one pair: a byte ring in a shared file."""

    def __init__(self, path: Path, capacity: int) -> None:
        self.path, self.capacity = path, capacity
        self.mm = _open_shared(path, _META + capacity)
        self.words = memoryview(self.mm).cast("q")
        self.data = torch.frombuffer(self.mm, dtype=torch.uint8, offset=_META, count=capacity)

    def used(self) -> int:
        return self.words[_TAIL] - self.words[_HEAD]

    def put(self, pos: int, src: torch.Tensor) -> int:
        """Copy the bytes ``src`` in at stream position ``pos``; returns the next position."""
        n, at = src.numel(), pos % self.capacity
        first = min(n, self.capacity - at)
        self.data[at : at + first].copy_(src[:first])
        if first < n:
            self.data[: n - first].copy_(src[first:])
        return pos + _pad(n)

    def get(self, pos: int, dst: torch.Tensor) -> None:
        n, at = dst.numel(), pos % self.capacity
        first = min(n, self.capacity - at)
        dst[:first].copy_(self.data[at : at + first])
        if first < n:
            dst[first:].copy_(self.data[: n - first])


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


class ShmTransport:
    """Messages between the ranks of one host through ``directory`` (see the module)."""

    def __init__(self, rank: int, world: int, directory: str | Path,
                 ring_bytes: int = RING_BYTES) -> None:
        self.rank, self.world = rank, world
        self.dir = Path(directory)
        self.ring_bytes = ring_bytes
        self.counter = ByteCounter()
        self._lock = threading.Lock()  # sends come from two threads (heartbeats)
        self._out: dict[tuple[int, bool], _Ring] = {}
        self._wake: dict[int, int] = {}  # peer -> its FIFO, opened for writing
        self._queued: dict[tuple[int, bool], deque] = {}  # frames waiting for space
        self._drainer: threading.Thread | None = None
        self._spills = 0
        self._dead: set[int] = set()
        self._pids: dict[int, int] = {}
        self._next = 0  # where a receive from any source starts looking (fairness)
        (self.dir / f"pid-{rank}").write_text(str(os.getpid()))
        self._fifo = self._open_fifo(rank)
        # every ring this rank reads, made now: a receive from any source looks at them all
        self._in = {(src, control): self._ring(src, rank, control)
                    for src in range(world) if src != rank for control in (False, True)}

    # ---- set-up --------------------------------------------------------------------------

    def _ring(self, src: int, dst: int, control: bool) -> _Ring:
        name = f"{'c' if control else 'd'}-{src}-{dst}"
        return _Ring(self.dir / name, CONTROL_RING_BYTES if control else self.ring_bytes)

    def _open_fifo(self, rank: int) -> int:
        path = self.dir / f"wake-{rank}"
        try:
            os.mkfifo(path, 0o600)
        except FileExistsError:
            pass
        # read-write: never blocks on open, and the FIFO always has a writer, so an idle
        # select does not spin on end-of-file
        return os.open(path, os.O_RDWR | os.O_NONBLOCK)

    # ---- sending -------------------------------------------------------------------------

    def send(self, dst: int, header: Header, tensors: Sequence[torch.Tensor] = ()) -> None:
        if not 0 <= dst < self.world or dst == self.rank:
            raise ValueError(f"rank {self.rank}: cannot send to rank {dst}")
        header, flat = _with_payload(header, tensors)
        self._send_frame(dst, header.encode(), flat, _is_control(header))
        self.counter.on_send(HEADER_BYTES + nbytes(*flat))

    def send_raw(self, dst: int, wire: torch.Tensor, tensors: Sequence[torch.Tensor] = (),
                 frame_len: int | None = None) -> None:
        """Send an arbitrary header tensor (tests of the receiver's validation);
        ``frame_len`` overrides the frame's length word."""
        self._send_frame(dst, wire, [t.reshape(-1) for t in tensors], False, frame_len)

    def _send_frame(self, dst: int, wire: torch.Tensor, flat: list[torch.Tensor],
                    control: bool, frame_len: int | None = None) -> None:
        key = (dst, control)
        with self._lock:
            ring = self._out.get(key)
            if ring is None:
                ring = self._out[key] = self._ring(self.rank, dst, control)
                self._wake[dst] = self._open_fifo(dst)
            body = sum(_pad(nbytes(t)) for t in flat)
            spill = 0
            if _FRAME_MIN + body > ring.capacity // 2:
                spill = self._spill(dst, flat)
                flat, body = [], 0
            frame = (_FRAME_MIN + body if frame_len is None else frame_len, spill,
                     wire, flat)
            queue = self._queued.get(key)
            if queue or not self._write(ring, dst, *frame):
                # the ring is full: a thread writes it (in order) as space frees; the
                # tensors are held until then, as an in-flight gloo send holds them
                self._queued.setdefault(key, deque()).append(frame)
                if self._drainer is None:
                    self._drainer = threading.Thread(target=self._drain, daemon=True,
                                                     name=f"shm-send-{self.rank}")
                    self._drainer.start()

    def _spill(self, dst: int, flat: list[torch.Tensor]) -> int:
        """Write a large payload to a file of its own; returns its number (> 0)."""
        self._spills += 1
        path = self.dir / f"x-{self.rank}-{dst}-{self._spills}"
        data = torch.cat([_bytes(t.contiguous()) for t in flat]) if flat else torch.zeros(0)
        with open(path, "wb") as f:
            f.write(memoryview(data.numpy()))
        return self._spills

    def _write(self, ring: _Ring, dst: int, frame_len: int, spill: int, wire: torch.Tensor,
               flat: list[torch.Tensor]) -> bool:
        """Copy one frame in and publish it, if it fits; then wake the receiver."""
        need = _FRAME_MIN + sum(_pad(nbytes(t)) for t in flat)  # = frame_len unless forged
        tail = ring.words[_TAIL]
        if ring.capacity - (tail - ring.words[_HEAD]) < need:
            return False
        pos = ring.put(tail, _bytes(torch.tensor([frame_len, spill], dtype=torch.int64)))
        pos = ring.put(pos, _bytes(wire.contiguous()))
        for t in flat:
            pos = ring.put(pos, _bytes(t.contiguous()))
        ring.words[_TAIL] = tail + need  # publish: the frame is whole before this store
        try:
            os.write(self._wake[dst], b"\1")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already
        return True

    def _drain(self) -> None:
        while True:
            with self._lock:
                for key, queue in self._queued.items():
                    while queue and self._write(self._out[key], key[0], *queue[0]):
                        queue.popleft()
            time.sleep(_SEND_POLL_S)

    def forget(self, lost: Collection[int]) -> None:
        """Drop the frames still queued for ``lost`` ranks (found dead): nothing will read
        their rings."""
        with self._lock:
            self._drop_queued(lost)

    def _drop_queued(self, lost: Collection[int]) -> None:  # the lock held
        for key, queue in self._queued.items():
            if key[0] in lost:
                queue.clear()

    def flush(self, lost: Collection[int] = ()) -> None:
        """Wait until every queued frame is in its ring (those to ``lost`` ranks are
        dropped); a destination that died meanwhile raises :class:`PeerLost`."""
        while True:
            with self._lock:
                self._drop_queued(lost)
                waiting = [k[0] for k, q in self._queued.items() if q]
            if not waiting:
                return
            for dst in waiting:
                if not self._alive(dst):
                    raise PeerLost(f"rank {self.rank}: rank {dst} exited with messages "
                                   "still to be delivered", rank=dst)
            time.sleep(_SEND_POLL_S)

    # ---- receiving -----------------------------------------------------------------------

    def recv(self, src: int | None = None, timeout_s: float | None = None, *,
             control: bool = False) -> Message:
        peers = ([src] if src is not None else
                 [p for p in range(self.world) if p != self.rank])
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        checked = time.monotonic()
        while True:
            n = len(peers)
            for i in range(n):
                peer = peers[(self._next + i) % n]
                ring = self._in.get((peer, control))
                if ring is not None and ring.used():
                    self._next = (self._next + i + 1) % max(n, 1)
                    return self._take(peer, ring)
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise TransportTimeout(f"rank {self.rank}: nothing arrived in {timeout_s} s")
            if src is not None and now - checked >= _CHECK_PEERS_S:
                # waiting for one peer (a worker for its shard): its death ends the wait.
                # From any source, as over gloo, a peer that exited is no error (a worker
                # that sent DONE, a finished shard): a dead worker is the heartbeats' to name
                checked = now
                if src not in self._dead and not self._alive(src):
                    ring = self._in.get((src, control))
                    if ring is None or not ring.used():
                        self._dead.add(src)
                        raise PeerLost(f"rank {self.rank}: rank {src} exited or died",
                                       rank=src)
            wait = _CHECK_PEERS_S if deadline is None else min(_CHECK_PEERS_S, deadline - now)
            # sleep until a sender's wake-up byte (every ring was empty just now; a frame
            # published since then came with a byte, so nothing is missed)
            if select.select([self._fifo], [], [], max(wait, 0.0))[0]:
                try:
                    os.read(self._fifo, 65536)
                except BlockingIOError:
                    pass

    def _take(self, src: int, ring: _Ring) -> Message:
        """The frame at the ring's head, validated; the head moves past it either way."""
        head, tail = ring.words[_HEAD], ring.words[_TAIL]
        if not _FRAME_MIN <= tail - head <= ring.capacity:
            ring.words[_HEAD] = tail  # a tail nobody could have published
            raise WireError(f"shared-memory ring from rank {src} is corrupt")
        prefix = torch.empty(2, dtype=torch.int64)
        ring.get(head, _bytes(prefix))
        frame_len, spill = prefix.tolist()
        if not _FRAME_MIN <= frame_len <= tail - head or frame_len % 8 or spill < 0:
            ring.words[_HEAD] = tail  # nothing says where the next frame starts
            raise WireError(f"a shared-memory frame from rank {src} has a bad length "
                            f"({frame_len})")
        end = head + frame_len
        try:
            wire = torch.empty(HEADER_LEN, dtype=torch.int64)
            ring.get(head + _PREFIX, _bytes(wire))
            header = Header.decode(wire)
            sizes = _payload_bytes(header)
            inline = 0 if spill else sum(_pad(s) for s in sizes)
            if frame_len != _FRAME_MIN + inline:
                end = tail  # the length and the header disagree: trust neither
                raise WireError("payload does not match what the header announced")
            tensors = header.payload_buffers()
            if spill:
                self._read_spill(src, spill, tensors, sum(sizes))
            else:
                pos = head + _FRAME_MIN
                for t in tensors:
                    ring.get(pos, _bytes(t))
                    pos += _pad(t.numel() * t.element_size())
        finally:
            ring.words[_HEAD] = end  # the receiver owns its copies now
        self.counter.on_recv(HEADER_BYTES + nbytes(*tensors))
        return Message(src, header, tensors)

    def _read_spill(self, src: int, spill: int, tensors: list[torch.Tensor],
                    size: int) -> None:
        path = self.dir / f"x-{src}-{self.rank}-{spill}"
        try:
            with open(path, "rb") as f:
                data = f.read()
            os.unlink(path)
        except OSError:
            raise WireError(f"a spilled payload from rank {src} is missing") from None
        if len(data) != size:
            raise WireError("payload does not match what the header announced")
        raw, pos = torch.frombuffer(bytearray(data), dtype=torch.uint8) if size else None, 0
        for t in tensors:
            n = t.numel() * t.element_size()
            _bytes(t).copy_(raw[pos : pos + n])
            pos += n

    # ---- peers ---------------------------------------------------------------------------

    def _alive(self, peer: int) -> bool:
        """Whether ``peer``'s process runs (True while it is not known yet: a rank that
        never made its transport is the heartbeats' to name)."""
        pid = self._pids.get(peer)
        if pid is None:
            try:
                pid = self._pids[peer] = int((self.dir / f"pid-{peer}").read_text())
            except (OSError, ValueError):
                return True
        return pid_alive(pid) and _not_zombie(pid)


def _not_zombie(pid: int) -> bool:
    """A dead child not yet reaped still answers kill(pid, 0)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
