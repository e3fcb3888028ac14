"""Which rank of a gang failed first, as the ranks themselves saw it.

When one rank of a gang dies (an injected fault, an error), its peers fail a few
milliseconds later on the broken connection. A scheduler that polls its ranks every few
tens of milliseconds, on a loaded machine, often finds both already ended and cannot tell
the cause from the consequence by the order it saw them in. So the first rank to fail says
so: before it exits it creates the gang's claim file with ``O_CREAT | O_EXCL``, which only
one process can win, and writes its rank and exit code. This is torchelastic's error file
(``TORCHELASTIC_ERROR_FILE``, the earliest one is the root cause) done with the kernel's
atomic create instead of timestamps.

A rank killed from outside (SIGKILL by the OOM killer, a lost node) cannot claim; the
scheduler weighs that in (:func:`cause`). ``phalanx.entry.scheduled`` arms the claim from
the environment (``PHALANX_FIRST_FAILURE``); outside a scheduler nothing is armed and
:func:`claim` does nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

_armed: tuple[str, int] | None = None   # (claim file, this process's rank)


def arm(path: str, rank: int) -> None:
    global _armed
    _armed = (path, rank) if path else None


def claim(code: int) -> None:
    """This process is about to exit with ``code`` (negative: the signal it kills itself
    with): claim the gang's failure if no rank has yet. Never raises."""
    if _armed is None:
        return
    path, rank = _armed
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:   # another rank was first (or the folder is gone): nothing to say
        return
    try:
        os.write(fd, f"{rank} {code}\n".encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def read(path: str | Path) -> tuple[int, int] | None:
    """The claim in ``path``: (rank, exit code), or None if there is none or it is not two
    integers (a rank killed between create and write leaves it empty)."""
    try:
        rank, code = map(int, Path(path).read_text().split())
    except (OSError, ValueError):   # ValueError: not two integers
        return None
    return (rank, code) if rank >= 0 else None


def cause(seen: tuple[tuple[int, int], ...], claimed: tuple[int, int] | None
          ) -> tuple[int, int] | None:
    """The rank (and its exit code) that caused a gang's failure, from ``seen`` (every rank
    the scheduler found ended badly at the first poll that found any, in rank order) and
    the claim. One rank seen: it. Several: a rank killed by a signal that did not claim
    (it could not: the kill came from outside, and its peers only failed because of it),
    else the claimant, else the lowest rank."""
    if not seen:
        return None
    if len(seen) == 1:
        return seen[0]
    claimant = claimed[0] if claimed is not None else -1
    killed = [(r, c) for r, c in seen if c < 0 and r != claimant]
    if killed:
        return killed[0]
    return next(((r, c) for r, c in seen if r == claimant), seen[0])
