"""The two collectives of sharded data parallel (ZeRO): reduce-scatter and all-gather over a
flat vector cut into N equal shards, rank r owning shard r.

ZeRO is the parameter server turned inside out: the state is sharded across the ranks as
our PS shards it across servers, but it is reduced and gathered by collectives instead of
pushed and pulled. Both halves of our ring allreduce (:mod:`phalanx.comm.allreduce`) are
here on their own, with the chunk ownership ZeRO needs (rank r ends with shard r, not r+1):

* ``ring``: ours, on point-to-point isend / irecv, N-1 steps each, every rank sending one
  shard per step to its right neighbour: X(N-1)/N bytes per rank per collective.
* ``native``: the backend's ``reduce_scatter_single`` / ``all_gather_single`` (gloo
  on CPU, NCCL on GPU); the backends report no bytes, so the same X(N-1)/N is counted and
  ``estimated`` says so.

A vector of P values is padded to N x S (S = ceil(P / N)), so shard r is
``[r S, (r + 1) S)``; the padding is zeros and never leaves the shard layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from phalanx.comm.allreduce import _GroupInfo
from phalanx.comm.counters import ByteCounter
from phalanx.errors import ConfigError


@dataclass(frozen=True)
class ShardLayout:
    """P values in N shards of S = ceil(P / N): shard r is ``[r S, (r + 1) S)`` of the
    padded vector, of which ``owned(r)`` are real values (the last shards may hold
    padding, or nothing, when P is small)."""

    numel: int
    world: int

    def __post_init__(self) -> None:
        if self.world < 1 or self.numel < 0:
            raise ValueError(f"ShardLayout({self.numel}, {self.world})")

    @property
    def shard(self) -> int:
        return max(1, math.ceil(self.numel / self.world))

    @property
    def padded(self) -> int:
        return self.shard * self.world

    def bounds(self, rank: int) -> tuple[int, int]:
        """The real values of shard ``rank``: ``[lo, hi)`` in the unpadded vector."""
        lo = min(rank * self.shard, self.numel)
        return lo, min(lo + self.shard, self.numel)

    def owned(self, rank: int) -> int:
        lo, hi = self.bounds(rank)
        return hi - lo


def shard_bytes(layout: ShardLayout, element_size: int) -> int:
    """Bytes one rank sends in one reduce-scatter or all-gather: (N-1) shards."""
    return (layout.world - 1) * layout.shard * element_size


class Sharded(Protocol):
    name: str
    estimated: bool

    def reduce_scatter(self, flat: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` (S values) = the sum over ranks of shard ``rank`` of ``flat`` (N x S
        values; ``flat`` is used as scratch and left changed)."""
        ...

    def all_gather(self, shard: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` (N x S) = every rank's ``shard`` (S values) in rank order."""
        ...


class RingSharded:
    """The reduce-scatter and the all-gather halves of the ring, rank r owning shard r."""

    name = "ring"
    estimated = False

    def __init__(self, group: dist.ProcessGroup | None = None,
                 counter: ByteCounter | None = None) -> None:
        self.g = _GroupInfo(group)
        self.counter = counter if counter is not None else ByteCounter()

    def _step(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        right, left = self.g.peer(self.g.rank + 1), self.g.peer(self.g.rank - 1)
        # the receive first: a send posted before its peer's receive goes at 2/3 of a busy
        # duplex link's rate under gloo (comm/allreduce.py, RingAllReduce)
        reqs = [dist.irecv(recv, left, group=self.g.group),
                dist.isend(send, right, group=self.g.group)]
        for req in reqs:  # sync point: the next step sends what this one received
            req.wait()
        self.counter.on_send(send.numel() * send.element_size())
        self.counter.on_recv(recv.numel() * recv.element_size())

    def reduce_scatter(self, flat: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        world, rank = self.g.world, self.g.rank
        s = out.numel()
        chunks = flat.view(world, s)
        scratch = torch.empty_like(out)
        # reduce-scatter: at step k rank r passes on its partial sum of shard r-k-1 and
        # adds its own values to the partial sum of shard r-k-2 from its left; after N-1
        # steps shard r has gone round the ring and holds every rank's values
        for k in range(world - 1):
            send, recv = (rank - k - 1) % world, (rank - k - 2) % world
            self._step(chunks[send], scratch)
            chunks[recv] += scratch
        out.copy_(chunks[rank])
        return out

    def all_gather(self, shard: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        world, rank = self.g.world, self.g.rank
        chunks = out.view(world, shard.numel())
        chunks[rank].copy_(shard)
        # all-gather: at step k rank r passes on shard r-k and receives shard r-k-1
        for k in range(world - 1):
            self._step(chunks[(rank - k) % world], chunks[(rank - k - 1) % world])
        return out


class NativeSharded:
    """The backend's reduce-scatter and all-gather (bytes counted by the formula)."""

    name = "native"
    estimated = True

    def __init__(self, group: dist.ProcessGroup | None = None,
                 counter: ByteCounter | None = None) -> None:
        self.g = _GroupInfo(group)
        self.counter = counter if counter is not None else ByteCounter()

    def _count(self, shard: torch.Tensor) -> None:
        size = (self.g.world - 1) * shard.numel() * shard.element_size()
        self.counter.on_send(size)
        self.counter.on_recv(size)

    def reduce_scatter(self, flat: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        dist.reduce_scatter_single(out, flat, group=self.g.group)
        self._count(out)
        return out

    def all_gather(self, shard: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        # a copy: the shard is often a view of ``out`` itself
        dist.all_gather_single(out, shard.clone(), group=self.g.group)
        self._count(shard)
        return out


SHARDED = {"ring": RingSharded, "native": NativeSharded}


def make_sharded(name: str, group: dist.ProcessGroup | None = None,
                 counter: ByteCounter | None = None) -> Sharded:
    """The reduce-scatter / all-gather pair ``--allreduce NAME`` asks for."""
    if name not in SHARDED:
        raise ConfigError(f"--allreduce: {name!r} has no reduce-scatter here; sharded data "
                          f"parallel takes {' or '.join(SHARDED)}")
    if dist.get_world_size(group) == 1:
        return _Alone(counter)
    return SHARDED[name](group, counter)


class _Alone:
    """One rank: its shard is the whole vector, nothing moves."""

    name = "alone"
    estimated = False

    def __init__(self, counter: ByteCounter | None = None) -> None:
        self.counter = counter if counter is not None else ByteCounter()

    def reduce_scatter(self, flat: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out.copy_(flat[: out.numel()])

    def all_gather(self, shard: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out.copy_(shard)
