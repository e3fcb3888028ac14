"""Graceful preemption of a rank group: SIGTERM -> every rank checkpoints at the same step
-> exit with :data:`PREEMPTED_EXIT`.

A scheduler that wants a job back (``phalanx schedule`` with a time-sliced or elastic
policy) sends SIGTERM to every rank of the job. A rank that armed its stop flag
(:mod:`phalanx.runtime.stop_flag`, done by ``phalanx.entry.scheduled`` before its first
heavy import) does not die: the signal sets the flag.

Ranks must checkpoint at the *same* step (a sync / average checkpoint is a collective),
and the signal reaches them at different moments. So after each step (each averaging
round) the loop asks :func:`agreed`: one ``all_reduce(MAX)`` of the flag, and every rank
learns in the same step that some rank was asked to stop. The loop then writes its
checkpoint and raises :class:`Preempted`; the entry exits with :data:`PREEMPTED_EXIT`,
which tells the scheduler "stopped on request, checkpoint written".

Unarmed (every run not started by the scheduler), :func:`agreed` is False without any
collective, and SIGTERM keeps its default action.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from phalanx.errors import PhalanxError
from phalanx.runtime import stop_flag
from phalanx.runtime.stop_flag import PREEMPTED_EXIT

__all__ = ["PREEMPTED_EXIT", "Preempted", "agreed"]


class Preempted(PhalanxError):
    """Every rank agreed to stop at ``step`` and its checkpoint is on disk (``unit``: what
    ``step`` counts; a parameter-server shard's are its updates)."""

    def __init__(self, step: int, unit: str = "step") -> None:
        super().__init__(f"preempted at {unit} {step}: checkpoint written")
        self.step = step


def agreed() -> bool:
    """Collective when armed: True on every rank iff any rank was asked to stop. Every rank
    of the default group must call it at the same point of its loop."""
    if not stop_flag.armed():
        return False
    flag = torch.tensor([1 if stop_flag.requested() else 0], dtype=torch.int32)
    if dist.is_initialized() and dist.get_world_size() > 1:
        # sync point: one small allreduce per step, only in a preemptible run
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())
