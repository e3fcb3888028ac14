"""The stop request of a scheduled rank: SIGTERM sets a flag instead of killing the
process (:func:`arm`). Kept free of torch so a rank can arm it first thing, before its
imports: a stop that arrives during start-up is then a request like any other, answered
with a checkpoint at the first step (:mod:`phalanx.runtime.preempt`)."""

from __future__ import annotations

import signal
import threading


class _StopRequest:
    """The one flag a signal handler may set (signals are per process, so is this)."""

    def __init__(self) -> None:
        self.armed = False
        self.requested = threading.Event()

    def handle(self, signum: int, frame: object) -> None:
        self.requested.set()


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
    return _STOP.requested.is_set()
