"""One planned fault carried out on a running schedule (:func:`inject`): a target found
among what runs now, the signal sent, the disk filled or the host crashed or cut off, and
what undoes it later (a SIGCONT, the filler removed; a host's node is the keeper's,
:mod:`hostfaults`)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from phalanx.cluster.chaos import procs
from phalanx.cluster.chaos.faults import (
    Fault,
    Planned,
    Target,
    disk_targets,
    fill,
    fork_server_targets,
    rank_targets,
    signal_pid,
    stopped_now,
    unfill,
)
from phalanx.cluster.chaos.hostfaults import HOST_KINDS, HostKeeper, host_of, host_targets
from phalanx.cluster.chaos.jobs import ChaosJob
from phalanx.cluster.chaos.watch import Seen
from phalanx.cluster.live.state import STATE_FILE

SCHEDULER_UP_S = 1.5    # a scheduler is killed only once it ran this long and saved its state


@dataclass
class Scene:
    """What a fault may hit: the schedule's folder and jobs, the jobs on a tmpfs, the
    scheduler (its pid, when it started, how to kill it), what the watch saw (the clock)."""

    out: Path
    jobs: list[ChaosJob]
    victims: list[ChaosJob]
    scheduler_pid: Callable[[], int | None]
    scheduler_since: Callable[[], float]     # time.monotonic() at its start
    scheduler_since_unix: Callable[[], float]
    kill_scheduler: Callable[[], None]
    seen: Seen
    undo: list[tuple[float, Callable[[], None]]] = field(default_factory=list)
    keeper: HostKeeper | None = None        # on Ray: the test hosts' nodes


def clock_now(out: Path, unix: float, since_unix: float) -> float | None:
    """The scheduler's clock at ``unix``, from its state file: the clock it saved plus the
    time since it wrote it (at most a loop pass early: the clock saved is the pass's
    start); None when the scheduler now running (up since ``since_unix``) has not saved
    yet (a killed one's clock stood still until its resume)."""
    try:
        d = json.loads((out / STATE_FILE).read_text())
        if float(d["unix"]) < since_unix:
            return None
        return round(float(d["clock"]) + unix - float(d["unix"]), 3)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _event_rank(job: ChaosJob, t: Target) -> int:
    """The ``rank`` field the target writes in its job's events."""
    word, _, rest = t.what.partition(" ")
    n = int(rest.split()[0]) if rest and rest.split()[0].isdigit() else 0
    return job.kind.servers + n if word == "worker" else n


def _candidates(p: Planned, scene: Scene, table: dict[int, procs.Proc]) -> list[Target]:
    if p.kind != "kill-scheduler" and clock_now(
            scene.out, time.time(), scene.scheduler_since_unix()) is None:
        return []   # no scheduler, or one that has not saved yet: what runs is a dead
        # scheduler's, which the resumed one stops (a fault there would show nowhere)
    if p.kind in ("kill-rank", "stop-rank"):
        found = rank_targets(table, scene.out, scene.jobs, False, scene.seen.rank_index)
        # a hang is not stacked on a hang: the first SIGCONT would end both
        return [t for t in found if p.kind == "kill-rank" or table[t.pid].state != "T"]
    if p.kind == "kill-shard":
        return rank_targets(table, scene.out, scene.jobs, True, scene.seen.rank_index)
    if p.kind == "kill-fork-server":
        pid = scene.scheduler_pid()
        return fork_server_targets(table, pid, scene.out, scene.jobs) if pid else []
    if p.kind == "disk-full":
        return disk_targets(table, scene.out, scene.victims)
    if p.kind in HOST_KINDS:
        return host_targets(table, scene.out, scene.jobs, scene.seen, scene.keeper)
    pid = scene.scheduler_pid()   # kill-scheduler
    up = time.monotonic() - scene.scheduler_since() >= SCHEDULER_UP_S
    if pid is None or not up or not (scene.out / STATE_FILE).is_file():
        return []
    if scene.keeper is not None and scene.keeper.busy():
        return []   # a host's loss would be the killed scheduler's, unseen by its resume
    return [Target("", "scheduler", pid, -1)]


def inject(p: Planned, f: Fault, scene: Scene, now: float) -> bool:
    """Carry out ``p`` now if it has a target (True), else leave it for later (False).
    ``f`` is filled in: when, the scheduler's clock then, the target, the outcome."""
    table = procs.scan()
    found = sorted(_candidates(p, scene, table), key=lambda t: (t.job, t.what, t.pid))
    if not found:
        return False
    t = found[min(int(p.pick * len(found)), len(found) - 1)]
    by_name = {j.name: j for j in scene.jobs}
    f.at, f.unix = round(now, 3), time.time()
    f.clock = clock_now(scene.out, f.unix, scene.scheduler_since_unix())
    f.job, f.target, f.pid, f.start = t.job, t.what, t.pid, t.start
    if t.driver:    # a driver-mode job's start: which of its drivers this is
        f.start = scene.seen.driver_start(t.job, t.driver)
    f.outcome = "injected"
    if p.kind == "kill-scheduler":
        scene.kill_scheduler()
    elif p.kind == "crash-host":
        scene.keeper.crash(host_of(t), f, p.hold)
    elif p.kind == "cut-link":
        scene.keeper.cut(host_of(t), f, p.hold)
    elif p.kind == "disk-full":
        folder = scene.out / "jobs" / t.job
        f.detail["filled_bytes"] = fill(folder)
        scene.undo.append((time.monotonic() + p.hold, lambda: unfill(folder)))
    elif p.kind == "stop-rank":
        if not signal_pid(t.pid, signal.SIGSTOP):
            f.outcome = "planned"     # it ended between the look and the signal: later
            return False
        f.detail["seen_stopped"] = stopped_now(t.pid)
        if not f.detail["seen_stopped"] and procs.scan_one(t.pid) in (None, "Z", "X"):
            f.outcome, f.detail = "planned", {}   # it was ending as it was stopped: later
            return False
        f.detail["event_rank"] = _event_rank(by_name[t.job.split(",")[0]], t)
        scene.undo.append((time.monotonic() + p.hold,
                           lambda: signal_pid(t.pid, signal.SIGCONT)))
    elif not signal_pid(t.pid, signal.SIGKILL):
        f.outcome = "planned"
        return False
    if p.kind not in ("stop-rank", "disk-full", *HOST_KINDS):
        f.hold = 0.0
    return True
