"""The stop request of a rank: SIGTERM sets a flag instead of killing the process
(:func:`arm`). Kept free of torch so a rank can arm it first thing, before its imports: a
stop that arrives during start-up is then a request like any other, answered with a
checkpoint at the first step (:mod:`phalanx.runtime.preempt`).

A parameter-server shard arms it too (``parallel/ps.py``): it has no steps, it answers
messages, and it may wait a long time for the next one. Its receive is a
:func:`interruptible` wait: a stop that comes while the shard waits raises :class:`Stop`
there at once (a message cut off by it was never applied, so its sender redoes it after
``--resume``); one that comes while the shard applies a message only sets the flag, which
the shard reads after the message."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

PREEMPTED_EXIT = 75      # EX_TEMPFAIL: stopped on request, continue later from the checkpoint


class Stop(BaseException):
    """A stop request cut into an :func:`interruptible` wait (a BaseException, like
    KeyboardInterrupt: no ``except Exception`` on the way swallows it)."""


class _StopRequest:
    """The one flag a signal handler may set (signals are per process, so is this).

    Plain attributes, no lock: the handler runs in the main thread between two bytecodes,
    and a second SIGTERM can run it again inside itself (the driver repeats its SIGTERM
    every 0.2 s until a rank ends). It was a ``threading.Event``, whose ``set()`` takes a
    lock: a shard whose first handler held it when the second SIGTERM came waited for
    itself for ever (seen in a stack dump: ``handle -> Event.set -> Condition.__enter__``
    nested once per later SIGTERM; the run hung until killed: 3 stops in the suite runs
    of two days, none in 85 stops tried by hand; tests/unit/test_stop_flag.py makes it
    happen every time)."""

    def __init__(self) -> None:
        self.armed = False
        self.waiting = False  # inside interruptible(): the handler raises Stop
        self.requested = False

    def handle(self, signum: int, frame: object) -> None:
        self.requested = True
        if self.waiting:
            self.waiting = False  # once: the code that handles Stop is not cut again
            raise Stop()


_STOP = _StopRequest()


def arm() -> None:
    """SIGTERM asks for a checkpoint-and-exit instead of killing the process (call it from
    the main thread, before training starts)."""
    _STOP.armed = True
    signal.signal(signal.SIGTERM, _STOP.handle)


def armed() -> bool:
    return _STOP.armed


def requested() -> bool:
    """A stop was asked for (SIGTERM arrived since :func:`arm`)."""
    return _STOP.requested


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """A wait a stop may cut: inside, a stop request (or one already made) raises
    :class:`Stop` at once. Only for waits whose interruption loses nothing (main thread)."""
    if not _STOP.armed:
        yield
        return
    _STOP.waiting = True
    try:
        if requested():
            _STOP.waiting = False
            raise Stop()
        yield
    finally:
        _STOP.waiting = False
