"""What runs on this host, read once from ``/proc`` per look: each process's parent, name,
command line and start time, and from that the processes of a schedule's jobs (the ranks
a job's rank records name, a driver and the ranks its fork server forked, the shards
among them) and the scheduler's own fork server."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

FORK_SERVER_NAME = "phalanx-fork"   # runtime/command_fork.py names it so (prctl)


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    comm: str
    state: str          # 'R', 'S', 'T' (stopped), 'Z' (zombie), ...
    started: int        # clock ticks after boot
    argv: tuple[str, ...]


def scan() -> dict[int, Proc]:
    """Every process of this host now (those that end while being read are left out)."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:]
        fields = rest.split()
        table[pid] = Proc(pid, int(fields[1]), comm, fields[0], int(fields[19]),
                          tuple(a.decode(errors="replace") for a in argv if a))
    return table


def live(table: dict[int, Proc], pid: int) -> bool:
    p = table.get(pid)
    return p is not None and p.state not in ("Z", "X")


def children(table: dict[int, Proc], pid: int) -> list[Proc]:
    """``pid``'s live children, oldest first (ranks are forked in rank order)."""
    return in_start_order([p for p in table.values() if p.ppid == pid and live(table, p.pid)])


def in_start_order(procs: list[Proc], pid_max: int | None = None) -> list[Proc]:
    """``procs`` oldest first: by start time, which counts clock ticks (10 ms), so ranks
    forked one after another often tie; ties go by pid, which the kernel hands out in
    increasing order but wraps at ``pid_max`` (32,768 on the CI machine, where a run
    starts more processes than that): a few processes started within moments span less
    than half the range, and when they span more the low ones came after the wrap."""
    if pid_max is None:
        try:
            pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
        except (OSError, ValueError):
            pid_max = 1 << 22
    pids = [p.pid for p in procs]
    wrapped = bool(pids) and max(pids) - min(pids) > pid_max // 2
    return sorted(procs, key=lambda p: (p.started, p.pid + pid_max
                                        if wrapped and p.pid < pid_max // 2 else p.pid))


def fork_servers(table: dict[int, Proc], pid: int) -> list[Proc]:
    """The fork servers ``pid`` started: forked from the command (named so) or a fresh
    interpreter (multiprocessing's ``forkserver`` in its command line)."""
    return [c for c in children(table, pid)
            if c.comm == FORK_SERVER_NAME or any("forkserver" in a for a in c.argv)]


def rank_pids(record: Path) -> list[tuple[int, int, int]]:
    """(start, rank, pid) of each rank record a job's ranks wrote (``OUT/ranks/NAME.jsonl``)."""
    try:
        lines = record.read_text().splitlines()
    except OSError:
        return []
    out = []
    for ln in lines:
        try:
            r = json.loads(ln)
            out.append((int(r["start"]), int(r["rank"]), int(r["pid"])))
        except (ValueError, KeyError, TypeError):
            continue   # a line being written
    return out


def drivers(table: dict[int, Proc], folder: Path) -> list[Proc]:
    """The ``phalanx train`` processes of a job's run folder that lead their group of
    copies: its ranks, forked from its fork server (itself a fork of the driver), carry
    the same command line, so a driver is one whose parent does not."""
    mark = str(folder)
    mine = {p.pid: p for p in table.values()
            if live(table, p.pid) and "train" in p.argv and mark in p.argv}
    return sorted((p for p in mine.values() if p.ppid not in mine), key=lambda p: p.started)


def driver_ranks(table: dict[int, Proc], driver: int) -> list[Proc]:
    """A driver's ranks in rank order (a parameter server's shards first)."""
    return [r for s in fork_servers(table, driver) for r in children(table, s.pid)]


def mentioning(table: dict[int, Proc], text: str, skip: Iterable[int] = ()) -> list[int]:
    """Live processes whose command line mentions ``text``."""
    skip = set(skip)
    return [p.pid for p in table.values() if p.pid not in skip and live(table, p.pid)
            and any(text in a for a in p.argv)]


def scan_one(pid: int) -> str | None:
    """One process's state letter now (None: gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[0]


def netns(pid: int) -> str:
    """A process's network namespace ('net:[inode]'; '' when it is gone)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""
