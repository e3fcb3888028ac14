"""Allreduce algorithms over ``torch.distributed``: our ring, the native collective, and the
seeds' main-node baseline. Each one sums a tensor in place over the group and counts the
bytes this rank moves in its :class:`~phalanx.comm.counters.ByteCounter`.

Traffic per rank for X bytes on N ranks (the seeds' argument for the ring):

* ring:       2 X (N-1)/N sent (and received) by every rank — independent of N in the limit;
* main node:  rank 0 sends and receives X (N-1); every other rank X — rank 0 is the bottleneck;
* native:     gloo / NCCL pick their own algorithm and do not report bytes; we count the
              bandwidth-optimal 2 X (N-1)/N (an estimate, marked as such in ``estimated``).

The ring's schedule is plain arithmetic (:func:`chunk_bounds`, :func:`ring_schedule`) so it
is unit-tested on virtual ranks in one process (:func:`simulate_ring`).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
import torch.distributed as dist

from phalanx.comm.counters import ByteCounter, nbytes
from phalanx.errors import ConfigError


class RingStep(NamedTuple):
    phase: str  # "reduce-scatter" or "all-gather"
    send_chunk: int  # index of the chunk this rank sends to its right neighbour
    recv_chunk: int  # index of the chunk it receives from its left neighbour


def chunk_bounds(numel: int, world: int) -> list[tuple[int, int]]:
    """``world`` contiguous (start, end) chunks covering ``numel`` elements; sizes differ by at
    most one, and chunks are empty when ``numel < world``."""
    base, extra = divmod(numel, world)
    bounds, start = [], 0
    for i in range(world):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def ring_schedule(world: int, rank: int) -> list[RingStep]:
    """The 2(N-1) steps of rank ``rank``. After the reduce-scatter, rank r holds the full sum
    of chunk (r+1) % N; the all-gather passes the finished chunks once around the ring."""
    steps = []
    for s in range(world - 1):
        steps.append(RingStep("reduce-scatter", (rank - s) % world, (rank - s - 1) % world))
    for s in range(world - 1):
        steps.append(RingStep("all-gather", (rank + 1 - s) % world, (rank - s) % world))
    return steps


def ring_bytes(numel: int, element_size: int, world: int, rank: int) -> int:
    """Bytes rank ``rank`` sends in one ring allreduce: every chunk but (rank+1)'s in the
    reduce-scatter, every chunk but (rank+2)'s in the all-gather. Equals 2 X (N-1)/N exactly
    when N divides the element count; over all ranks it is always 2 X (N-1)."""
    if world == 1:
        return 0
    sizes = [hi - lo for lo, hi in chunk_bounds(numel, world)]
    return (2 * numel - sizes[(rank + 1) % world] - sizes[(rank + 2) % world]) * element_size


def simulate_ring(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run the ring schedule on virtual ranks in one process (lock-step), for tests: returns
    each rank's result. Uses exactly the chunking and schedule the real ring uses."""
    world = len(tensors)
    bufs = [t.detach().clone().reshape(-1) for t in tensors]
    bounds = chunk_bounds(bufs[0].numel(), world)
    schedules = [ring_schedule(world, r) for r in range(world)]
    for s in range(2 * (world - 1)):
        # every rank sends first (a snapshot), then every rank receives from its left
        outgoing = []
        for r in range(world):
            lo, hi = bounds[schedules[r][s].send_chunk]
            outgoing.append(bufs[r][lo:hi].clone())
        for r in range(world):
            step = schedules[r][s]
            left = (r - 1) % world
            assert schedules[left][s].send_chunk == step.recv_chunk, "ring schedule mismatch"
            lo, hi = bounds[step.recv_chunk]
            if step.phase == "reduce-scatter":
                bufs[r][lo:hi] += outgoing[left]
            else:
                bufs[r][lo:hi] = outgoing[left]
    return [b.reshape(t.shape) for b, t in zip(bufs, tensors)]


class AllReduce(Protocol):
    """Sums ``tensor`` in place over the group (every rank gets the sum)."""

    name: str
    counter: ByteCounter
    estimated: bool

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]: ...


class _GroupInfo:
    """Rank / world / global-rank mapping for ``group`` (None = the default group)."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._global = [dist.get_global_rank(group, r) if group is not None else r
                        for r in range(self.world)]

    def peer(self, group_rank: int) -> int:
        """p2p calls take global ranks even when a group is passed."""
        return self._global[group_rank % self.world]


def _segments(n: int, seg: int) -> list[tuple[int, int]]:
    return [(a, min(a + seg, n)) for a in range(0, n, seg)]


class RingAllReduce:
    """Baidu's ring allreduce on point-to-point isend/irecv: reduce-scatter then all-gather
    over N chunks, each rank talking only to its two neighbours."""

    name = "ring"
    estimated = False

    def __init__(self, group: dist.ProcessGroup | None = None,
                 counter: ByteCounter | None = None, segment_bytes: int = 1 << 20) -> None:
        self.g = _GroupInfo(group)
        self.counter = counter if counter is not None else ByteCounter()
        self.segment_bytes = segment_bytes

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        world, rank = self.g.world, self.g.rank
        if world == 1 or tensor.numel() == 0:
            return tensor
        flat = tensor.view(-1) if tensor.is_contiguous() else tensor.reshape(-1).clone()
        bounds = chunk_bounds(flat.numel(), world)
        right, left = self.g.peer(rank + 1), self.g.peer(rank - 1)
        scratch = torch.empty(max(hi - lo for lo, hi in bounds), dtype=flat.dtype,
                              device=flat.device)
        seg = max(1, self.segment_bytes // flat.element_size())
        for step in ring_schedule(world, rank):
            slo, shi = bounds[step.send_chunk]
            rlo, rhi = bounds[step.recv_chunk]
            # both neighbours compute the same chunk sizes, so an empty chunk (numel < N)
            # is skipped on both ends of the link and no one waits for it
            # messages are cut in the same segments on both ends (gloo matches a receive
            # to a send of the same size)
            # the receives are posted before the sends: gloo sends a message posted before
            # its peer's receive at 2/3 of the link's rate when both directions are busy
            # (measured: N = 2 at 20 Mbit/s, 943 KB back to back, 581 ms a ring against
            # 396 with the receives first, gloo's own allreduce 395; docs/scale.md)
            reduce = step.phase == "reduce-scatter"
            # the all-gather receives straight into place (the chunk is not being sent
            # in this step); the reduce-scatter receives into scratch, then adds, in
            # segments, so adding one segment overlaps receiving the next
            target = scratch if reduce else flat[rlo:rhi]
            segs = _segments(rhi - rlo, seg)
            recvs = [dist.irecv(target[a:b], left, group=self.g.group) for a, b in segs]
            sends = [dist.isend(flat[slo + a : slo + b], right, group=self.g.group)
                     for a, b in _segments(shi - slo, seg)]
            if shi > slo:
                self.counter.on_send((shi - slo) * flat.element_size())
            if rhi > rlo:
                for (a, b), req in zip(segs, recvs):
                    req.wait()
                    if reduce:
                        flat[rlo + a : rlo + b] += scratch[a:b]
                self.counter.on_recv((rhi - rlo) * flat.element_size())
            for req in sends:  # sync point: the next step sends what this step received
                req.wait()
        if flat.data_ptr() != tensor.data_ptr():
            tensor.copy_(flat.view_as(tensor))
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``tensor`` (same shape on all ranks), passed N-1 times around the ring."""
        world, rank = self.g.world, self.g.rank
        out = [torch.empty_like(tensor) for _ in range(world)]
        out[rank].copy_(tensor)
        right, left = self.g.peer(rank + 1), self.g.peer(rank - 1)
        for s in range(world - 1):
            send, recv = out[(rank - s) % world], out[(rank - s - 1) % world]
            reqs = [dist.irecv(recv, left, group=self.g.group),  # receive first (above)
                    dist.isend(send.contiguous(), right, group=self.g.group)]
            for req in reqs:
                req.wait()
            self.counter.on_send(nbytes(send))
            self.counter.on_recv(nbytes(recv))
        return out


class NativeAllReduce:
    """``dist.all_reduce`` (gloo on CPU, NCCL on GPU): the reference our ring is measured
    against. Bytes are the bandwidth-optimal estimate; the backends do not report them."""

    name = "native"
    estimated = True

    def __init__(self, group: dist.ProcessGroup | None = None,
                 counter: ByteCounter | None = None) -> None:
        self.g = _GroupInfo(group)
        self.counter = counter if counter is not None else ByteCounter()

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.g.world == 1:
            return tensor
        dist.all_reduce(tensor, group=self.g.group)
        moved = ring_bytes(tensor.numel(), tensor.element_size(), self.g.world, self.g.rank)
        self.counter.on_send(moved)
        self.counter.on_recv(moved)
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(tensor) for _ in range(self.g.world)]
        dist.all_gather(out, tensor.contiguous(), group=self.g.group)
        moved = nbytes(tensor) * (self.g.world - 1)
        self.counter.on_send(moved)
        self.counter.on_recv(moved)
        return out


class MainNodeAllReduce:
    """The seeds' baseline: every rank sends its tensor to rank 0, which sums them (in rank
    order) and sends the sum back to each. Rank 0 moves 2 X (N-1) bytes."""

    name = "main"
    estimated = False

    def __init__(self, group: dist.ProcessGroup | None = None,
                 counter: ByteCounter | None = None) -> None:
        self.g = _GroupInfo(group)
        self.counter = counter if counter is not None else ByteCounter()

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        world, rank = self.g.world, self.g.rank
        if world == 1 or tensor.numel() == 0:
            return tensor
        flat = tensor.contiguous()
        size = nbytes(flat)
        if rank == 0:
            parts = [torch.empty_like(flat) for _ in range(world - 1)]
            reqs = [dist.irecv(p, self.g.peer(r + 1), group=self.g.group)
                    for r, p in enumerate(parts)]
            for req in reqs:  # sync point: the sum needs every rank's tensor
                req.wait()
            for p in parts:
                self.counter.on_recv(size)
                flat += p
            reqs = [dist.isend(flat, self.g.peer(r), group=self.g.group) for r in range(1, world)]
            for req in reqs:
                req.wait()
                self.counter.on_send(size)
        else:
            dist.isend(flat, self.g.peer(0), group=self.g.group).wait()
            self.counter.on_send(size)
            dist.irecv(flat, self.g.peer(0), group=self.g.group).wait()
            self.counter.on_recv(size)
        if flat.data_ptr() != tensor.data_ptr():
            tensor.copy_(flat)
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Gather to rank 0, then rank 0 sends the whole list to every rank."""
        world, rank = self.g.world, self.g.rank
        flat = tensor.contiguous()
        stacked = torch.empty((world, *flat.shape), dtype=flat.dtype, device=flat.device)
        size = nbytes(flat)
        if rank == 0:
            stacked[0].copy_(flat)
            reqs = [dist.irecv(stacked[r], self.g.peer(r), group=self.g.group)
                    for r in range(1, world)]
            for req in reqs:
                req.wait()
                self.counter.on_recv(size)
            reqs = [dist.isend(stacked, self.g.peer(r), group=self.g.group)
                    for r in range(1, world)]
            for req in reqs:
                req.wait()
                self.counter.on_send(size * world)
        elif world > 1:
            dist.isend(flat, self.g.peer(0), group=self.g.group).wait()
            self.counter.on_send(size)
            dist.irecv(stacked, self.g.peer(0), group=self.g.group).wait()
            self.counter.on_recv(size * world)
        return list(stacked.unbind(0))


ALLREDUCES = {"ring": RingAllReduce, "native": NativeAllReduce, "main": MainNodeAllReduce}


def make_allreduce(name: str, group: dist.ProcessGroup | None = None,
                   counter: ByteCounter | None = None) -> AllReduce:
    """The allreduce ``--allreduce NAME`` asks for."""
    if name not in ALLREDUCES:
        raise ConfigError(f"--allreduce: {name!r} is not one of {', '.join(ALLREDUCES)}")
    return ALLREDUCES[name](group, counter)
