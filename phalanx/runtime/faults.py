"""Fault injection for tests and studies: kill a process at a chosen point, drop messages.

Injection happens inside the real processes: a killed process really exits
(:func:`die` calls ``os._exit``: no ``finally`` blocks, no goodbye messages, its sockets
are closed by the operating system), exactly what its peers see when a machine dies.

Flags (fields of :class:`~phalanx.config.RunConfig`):

* ``--kill-worker RANK@STEP[,RANK@STEP...]`` — worker RANK exits when it is about to start
  step STEP (after STEP steps), e.g. ``2@15``;
* ``--kill-server SHARD@UPDATE[,...]`` — parameter-server shard SHARD exits right after it
  applied its UPDATE-th update;
* ``--drop-messages P`` — every worker -> server push is lost with probability P (a lossy
  link; seeded, so a run is repeatable).

API for a strategy (small on purpose):

* :func:`parse_kills` turns a flag value into :class:`Kill` items (one-line ``ConfigError``);
* :func:`kill_point` says at which step / update a given rank must die (or ``None``);
* :func:`die` logs a ``fault`` event, prints one line to stderr and exits the process;
* :class:`MessageDropper` decides, seeded and per process, which messages to lose.

A killed parameter-server worker dies by SIGKILL (:data:`KILLED_WORKER_EXIT` is
``-SIGKILL``), exactly as a crash, ``kill -9`` or the OOM killer ends it: the local
launcher lets the run go on without it (``phalanx.runtime.supervise``) and the servers drop
it after ``--ps-timeout``, so tests of the injected fault exercise the path of a real one.
(``torchrun`` stops the whole group when any process dies; ``--max-restarts`` restarts it.)
A killed server exits with :data:`KILLED_SERVER_EXIT` (non-zero): the run must stop so that
``--resume`` can restart it from the last checkpoint.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from phalanx.errors import ConfigError
from phalanx.runtime import first_failure

KILLED_WORKER_EXIT = -signal.SIGKILL  # negative: die by this signal (os.kill), not exit
KILLED_SERVER_EXIT = 3


@dataclass(frozen=True)
class Kill:
    """Process ``rank`` dies at point ``at`` (a step for workers, an update for servers)."""

    rank: int
    at: int


def parse_kills(text: str, flag: str, what: str = "STEP") -> tuple[Kill, ...]:
    """``"2@15,0@40"`` -> ``(Kill(2, 15), Kill(0, 40))``; ``""`` -> ``()``.

    ``flag`` names the input in errors (``--kill-worker``); ``what`` the point (STEP)."""
    if not text:
        return ()
    out: dict[int, Kill] = {}
    for item in text.split(","):
        rank_s, sep, at_s = item.strip().partition("@")
        try:
            rank, at = int(rank_s), int(at_s)
        except ValueError:
            raise ConfigError(f"{flag}: {item!r} is not RANK@{what} (e.g. 2@15)") from None
        if not sep or rank < 0 or at < 1:
            raise ConfigError(f"{flag}: {item!r} needs a rank >= 0 and a {what.lower()} >= 1")
        if rank in out:
            raise ConfigError(f"{flag}: rank {rank} is named twice")
        out[rank] = Kill(rank, at)
    return tuple(out.values())


def kill_point(kills: tuple[Kill, ...], rank: int) -> int | None:
    """The step / update at which ``rank`` must die, or None."""
    return next((k.at for k in kills if k.rank == rank), None)


def die(log: Callable[..., Any] | None, role: str, rank: int, at: str, code: int) -> NoReturn:
    """Exit this process now, as a crash would (no cleanup, no messages to peers).

    ``log`` (an ``EventLog.log``) records a ``fault`` event first, so studies can measure
    what the fault cost (e.g. updates lost by a killed server)."""
    if log is not None:
        log("fault", fault=f"kill-{role}", **{role: rank}, at=at)  # e.g. worker=2
    first_failure.claim(code)
    sys.stderr.write(f"phalanx: fault injection: {role} {rank} killed at {at}\n")
    sys.stderr.flush()
    if code < 0:
        os.kill(os.getpid(), -code)
    os._exit(code)


class MessageDropper:
    """Loses each message with probability ``p`` (seeded: the same run drops the same
    messages). ``dropped`` counts what this process lost."""

    def __init__(self, p: float, seed: int) -> None:
        if not 0.0 <= p < 1.0:
            raise ValueError("drop probability must be in [0, 1)")
        self.p = p
        self.dropped = 0
        self._rng = random.Random(seed)

    def drop(self) -> bool:
        if self.p <= 0.0 or self._rng.random() >= self.p:
            return False
        self.dropped += 1
        return True


FAULT_FLAGS = ("kill_worker", "kill_server", "drop_messages")


def check_fault_flags(cfg: Any, honoured_by: dict[str, tuple[str, ...]], ranks: int,
                      flags: str) -> None:
    """Validate the fault-injection fields of a RunConfig (one-line ConfigError).

    ``honoured_by``: flag -> the strategies that honour it (their specs say so; a flag the
    chosen strategy would ignore is an error); ``ranks``: how many computing ranks the run
    has, and ``flags`` the flags that say so."""
    for name in FAULT_FLAGS:
        strategies = honoured_by.get(name, ())
        if getattr(cfg, name) and cfg.strategy not in strategies:
            raise ConfigError(f"--{name.replace('_', '-')}: not supported by --strategy "
                              f"{cfg.strategy} (only {', '.join(strategies)})")
    for k in parse_kills(cfg.kill_worker, "--kill-worker"):
        if k.rank >= ranks:
            raise ConfigError(f"--kill-worker: worker {k.rank} does not exist with {flags}")
    for k in parse_kills(cfg.kill_server, "--kill-server", "UPDATE"):
        if k.rank >= cfg.servers:
            raise ConfigError(f"--kill-server: shard {k.rank} does not exist with "
                              f"--servers {cfg.servers}")
