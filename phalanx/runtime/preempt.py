"""Graceful preemption of a rank group: SIGTERM -> every rank checkpoints at the same step
-> exit with :data:`PREEMPTED_EXIT`.

A scheduler that wants a job back (``phalanx schedule`` with a time-sliced or elastic
policy) sends SIGTERM to every rank of the job. A rank that armed this module
(:func:`arm`, done by the ``torchrun`` entry when its launcher asks for it) does not die:
the signal sets a flag. Ranks must checkpoint at the *same* step (a sync / average
checkpoint is a collective), and the signal reaches them at different moments, so after
each step (each averaging round) the loop asks :func:`agreed`: one ``all_reduce(MAX)`` of
the flag, so every rank learns in the same step that some rank was asked to stop. The loop
then writes its checkpoint and raises :class:`Preempted`; the entry exits with
:data:`PREEMPTED_EXIT`, which tells the scheduler "stopped on request, checkpoint written"
(any other exit after a stop request means the job lost its work since the last periodic
checkpoint).

Unarmed (every run not started by the scheduler), :func:`agreed` is False without any
collective, and SIGTERM keeps its default action.
"""

from __future__ import annotations

import signal
import threading

import torch
import torch.distributed as dist

from phalanx.errors import PhalanxError

PREEMPTED_EXIT = 75      # EX_TEMPFAIL: stopped on request, continue later from the checkpoint


class Preempted(PhalanxError):
    """Every rank agreed to stop at ``step`` and its checkpoint is on disk."""

    def __init__(self, step: int) -> None:
        super().__init__(f"preempted at step {step}: checkpoint written")
        self.step = step


class _StopRequest:
    """The one flag a signal handler may set (signals are per process, so is this)."""

    def __init__(self) -> None:
        self.armed = False
        self.requested = threading.Event()

    def handle(self, signum: int, frame: object) -> None:
        self.requested.set()


_STOP = _StopRequest()


def arm() -> None:
    """SIGTERM asks for a checkpoint-and-exit instead of killing the rank (main thread
    only: the launcher calls it before training starts)."""
    _STOP.armed = True
    signal.signal(signal.SIGTERM, _STOP.handle)


def armed() -> bool:
    return _STOP.armed


def requested() -> bool:
    """This rank got the stop signal (tests, and single-process runs)."""
    return _STOP.requested.is_set()


def agreed() -> bool:
    """Collective when armed: True on every rank iff any rank was asked to stop. Every rank
    of the default group must call it at the same point of its loop."""
    if not _STOP.armed:
        return False
    flag = torch.tensor([1 if _STOP.requested.is_set() else 0], dtype=torch.int32)
    if dist.is_initialized() and dist.get_world_size() > 1:
        # sync point: one small allreduce per step, only in a preemptible run
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())
