"""What a run that did not stop was doing, for a test's failure message: every process of
its tree with its state and kernel wait, and each one's Python stacks (``kill -USR2``:
``phalanx.runtime.signals.enable_stack_dumps``; they go to the process's stderr, which
the test reads after killing the tree)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from phalanx.runtime.signals import STACK_DUMP_SIGNAL


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants now."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _describe(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat.rsplit(")", 1)[1].split()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
        return f"{pid} ppid {rest[1]} state {rest[0]} wchan {wchan or '-'} {comm}"
    except OSError:
        return f"{pid} gone"


def dumps_stacks(pid: int) -> bool:
    """Whether ``pid`` catches ``STACK_DUMP_SIGNAL`` (a fork server does not: it would die)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(ln.split()[1] for ln in status.splitlines() if ln.startswith("SigCgt:"))
    return bool(int(caught, 16) & (1 << (STACK_DUMP_SIGNAL - 1)))


def dump_and_kill(p: subprocess.Popen, wait_s: float = 0.3) -> str:
    """The listing of ``p``'s tree; each process printed its stacks (to the stderr the test
    reads next); then the whole tree is killed, so ``communicate`` returns."""
    pids = tree(p.pid)
    listing = "\n".join(_describe(q) for q in pids)
    for q in filter(dumps_stacks, pids):  # one at a time: they share the test's pipe
        try:
            os.kill(q, STACK_DUMP_SIGNAL)
        except OSError:
            continue
        time.sleep(wait_s)
    for q in pids:
        try:
            os.kill(q, signal.SIGKILL)
        except OSError:
            pass
    return listing


def communicate_or_dump(p: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """``p.communicate(timeout)``; past it, an AssertionError with the tree's listing and
    what it printed, stacks included."""
    try:
        return p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        listing = dump_and_kill(p)
        out, err = p.communicate(timeout=30)
        raise AssertionError(f"not ended {timeout:g} s after the stop; its processes:\n"
                             f"{listing}\nstderr (stacks on SIGUSR2 last):\n"
                             f"{(err or '')[-12000:]}") from None
