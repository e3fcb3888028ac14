"""Groups of threads in one process, for unit tests of collective code:

* :class:`ThreadGroup` / :func:`run_group`: an allreduce group whose collectives sum in rank
  order in the tensor's own dtype (half precision sums in half precision, as gloo does);
* :class:`P2P` / :func:`on_threads`: ``torch.distributed``'s point-to-point calls (gloo's
  matching rule: per pair of ranks, in order, same size) for the real allreduce classes.

A rank's failure breaks the barrier instead of hanging the others. The real-process tests
are in tests/distributed/."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from phalanx.comm import allreduce as ar


class ThreadGroup:
    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=5)
        self.slots: list[torch.Tensor | None] = [None] * world

    def _exchange(self, rank: int, t: torch.Tensor) -> list[torch.Tensor]:
        self.slots[rank] = t.detach().clone()
        self.barrier.wait()
        parts = [s.clone() for s in self.slots]
        self.barrier.wait()  # nobody overwrites a slot before everyone read them
        return parts

    def member(self, rank: int) -> Member:
        return Member(self, rank)


class Member:
    """One rank's :class:`~phalanx.comm.allreduce.AllReduce`."""

    estimated = False

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group, self.rank = group, rank
        self.calls = 0

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        parts = self.group._exchange(self.rank, tensor)
        total = parts[0].clone()
        for p in parts[1:]:
            total += p
        return tensor.copy_(total)

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        self.calls += 1
        return self.group._exchange(self.rank, tensor)


def run_group(world: int, fn: Callable[[int, Member], Any]) -> list[Any]:
    """``fn(rank, allreduce)`` on ``world`` threads; their results in rank order (the
    first exception is re-raised here)."""
    group = ThreadGroup(world)
    out: list[Any] = [None] * world
    errors: list[BaseException] = []

    def one(rank: int) -> None:
        try:
            out[rank] = fn(rank, group.member(rank))
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            errors.append(e)
            group.barrier.abort()

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


class _Done:
    def wait(self) -> None:
        return None


class _Recv:
    def __init__(self, net: P2P, src: int, dst: int, into: torch.Tensor) -> None:
        self.net, self.src, self.dst, self.into = net, src, dst, into

    def wait(self) -> None:
        got = self.net.pipes[(self.src, self.dst)].get(timeout=5)
        assert got.shape == self.into.shape, "gloo matches a receive to a send of one size"
        self.into.copy_(got)


class P2P:
    """A stand-in for ``torch.distributed`` seen by one thread per rank. ``group``: the
    process group every call must name (its ``ranks`` list maps group ranks to the global
    ranks that point-to-point calls take); None is the default group."""

    def __init__(self, world: int, group=None) -> None:
        self.world, self.group = world, group
        self.local = threading.local()
        self.pipes = {(a, b): queue.Queue() for a in range(world) for b in range(world)}
        self.barrier = threading.Barrier(world, timeout=5)
        self.slots: list[torch.Tensor | None] = [None] * world

    def _check(self, group) -> None:
        assert group is self.group, "a collective on another group than the allreduce's"

    # what the allreduce module calls
    def get_world_size(self, group=None) -> int:
        self._check(group)
        return self.world

    def get_rank(self, group=None) -> int:
        self._check(group)
        me = self.local.rank
        return group.ranks.index(me) if group is not None else me

    def get_global_rank(self, group, group_rank: int) -> int:
        self._check(group)
        return group.ranks[group_rank]

    def isend(self, t: torch.Tensor, dst: int, group=None) -> _Done:
        self._check(group)
        self.pipes[(self.local.rank, dst)].put(t.detach().clone())
        return _Done()

    def irecv(self, t: torch.Tensor, src: int, group=None) -> _Recv:
        self._check(group)
        return _Recv(self, src, self.local.rank, t)

    def _everyone(self, t: torch.Tensor) -> list[torch.Tensor]:
        self.slots[self.local.rank] = t.detach().clone()
        self.barrier.wait()
        parts = list(self.slots)
        self.barrier.wait()
        return parts

    def all_reduce(self, t: torch.Tensor, group=None) -> None:
        self._check(group)
        parts = self._everyone(t)
        t.copy_(sum(parts[1:], parts[0].clone()))

    def all_gather(self, out: list[torch.Tensor], t: torch.Tensor, group=None) -> None:
        self._check(group)
        parts = self._everyone(t)
        if self.group is not None:  # in group-rank order
            parts = [parts[g] for g in self.group.ranks]
        for o, p in zip(out, parts):
            o.copy_(p)


def on_threads(monkeypatch, world: int, fn, modules=(ar,), group=None) -> list:
    """``fn(rank)`` on ``world`` thread ranks (``rank``: the global one), with
    ``torch.distributed`` in ``modules`` replaced by one :class:`P2P` (its results in
    rank order)."""
    net = P2P(world, group)
    fake = SimpleNamespace(
        get_world_size=net.get_world_size, get_rank=net.get_rank, isend=net.isend,
        irecv=net.irecv, all_reduce=net.all_reduce, all_gather=net.all_gather,
        get_global_rank=net.get_global_rank, is_initialized=lambda: True)
    for module in modules:
        monkeypatch.setattr(module, "dist", fake)
    out, errors = [None] * world, []

    def one(rank: int) -> None:
        net.local.rank = rank
        try:
            out[rank] = fn(rank)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test
            errors.append(e)
            net.barrier.abort()

    threads = [threading.Thread(target=one, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    assert all(p.empty() for p in net.pipes.values()), "a message nobody received"
    return out
