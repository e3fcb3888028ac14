"""Where a rank ran: one JSON line per rank per start, appended by the rank itself.

A scheduler that places ranks (``phalanx schedule``) tells each rank's process, through its
launcher, the node the engine actually put it on (Ray: the labels of the actor's node) and
the devices it may use (``CUDA_VISIBLE_DEVICES``, set by the scheduler from the devices it
assigned). The rank writes them down before training starts, so a check of "ranks ran
where the scheduler said" compares the scheduler's record with what each rank saw, not the
scheduler's record with itself.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class RankRecord:
    start: int            # the scheduler's start number of the job (0, 1, ... per resume)
    rank: int
    world: int
    node: str             # the node the engine reports for this rank's process
    devices: str          # CUDA_VISIBLE_DEVICES as the rank saw it
    pid: int
    host: str
    unix: float = 0.0     # when the rank's process got here (its start-up begins)
    netns: str = ""       # its network namespace ('net:[inode]'): which test host it ran in


def append(path: str | Path, rec: RankRecord) -> None:
    """One line, one ``write`` on an ``O_APPEND`` file: lines of concurrent ranks never
    interleave."""
    line = (json.dumps(asdict(rec), sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _netns() -> str:
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return ""


def of_this_process(start: int, rank: int, world: int, node: str, devices: str) -> RankRecord:
    return RankRecord(start, rank, world, node, devices, os.getpid(), socket.gethostname(),
                      round(time.time(), 4), _netns())


def read(path: str | Path) -> list[RankRecord]:
    """Every record in ``path`` (none if it does not exist); a torn last line is skipped."""
    p = Path(path)
    if not p.is_file():
        return []
    out = []
    for line in p.read_text(errors="replace").splitlines():
        try:
            out.append(RankRecord(**json.loads(line)))
        except (ValueError, TypeError):
            continue
    return out
