"""An allreduce group of threads in one process, for the exchange's value tests: every rank
is a thread with its own :class:`~phalanx.comm.exchange.Compression`, the collectives sum
in rank order in the tensor's own dtype (half precision sums in half precision, as gloo
does), and a rank's failure breaks the barrier instead of hanging the others."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch


class ThreadGroup:
    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=30)
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
