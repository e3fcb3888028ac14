"""The fault kinds, the seeded plan of a run's faults, and how each is found a target and
injected on the local engine.

=================  =============================================================
kind               what is done
=================  =============================================================
kill-rank          SIGKILL to a rank: a sync / pipeline rank, a PS worker, or a
                   single-process job's process
kill-shard         SIGKILL to a parameter-server shard
kill-fork-server   SIGKILL to the scheduler's fork server (the ranks it forked die
                   with it, PR_SET_PDEATHSIG)
stop-rank          SIGSTOP to a rank, SIGCONT ``hold`` seconds later (a hang)
kill-scheduler     ``kill -9`` of ``phalanx schedule``; the harness then starts
                   ``phalanx schedule --resume``
disk-full          a job's run folder is a small tmpfs: a filler leaves it a few
                   hundred KiB, removed ``hold`` seconds later (a checkpoint write
                   hits ENOSPC meanwhile)
crash-host         (Ray) a test host's every process SIGKILLed, its node started
                   again ``hold`` seconds later (:mod:`hostfaults`)
cut-link           (Ray) a test host's link down for ``hold`` seconds (:mod:`hostfaults`)
=================  =============================================================

The plan (times, kinds, which target, holds) is a pure function of the seed; which
process a pick lands on depends on what runs at that moment, so a run is reproducible in
its plan, not in its outcome (real processes on a shared machine)."""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from phalanx.cluster.chaos import procs
from phalanx.cluster.chaos.jobs import ChaosJob

FAULT_KINDS = ("kill-rank", "kill-shard", "kill-fork-server", "stop-rank", "kill-scheduler",
               "disk-full", "crash-host", "cut-link")
# what each engine can be dealt: Ray's ranks are started by its actors (no fork server of
# the scheduler's) on test hosts (whose run folders are not ours to mount over)
ENGINE_KINDS = {
    "local": FAULT_KINDS[:6],
    "ray": ("kill-rank", "kill-shard", "stop-rank", "kill-scheduler", "crash-host",
            "cut-link"),
}
HOLD_S = (0.5, 3.0)             # a hang's and a full disk's length, drawn in this range
# a crashed host's node starts again after this; a link is down this long: below the
# fence (3.75 s with the test cluster's health check), past it, past the verdict (8 s)
HOLDS = {"crash-host": (2.0, 8.0), "cut-link": (1.0, 14.0)}
FREE_LEFT = 256 << 10           # what a filled tmpfs keeps free: events fit, a checkpoint not
TMPFS_SIZE = "24m"              # a disk-full job's run folder
FILLER = ".chaos-filler"


@dataclass(frozen=True)
class Planned:
    """One planned fault: when (seconds after the schedule started), what, which of the
    targets then live (``pick`` in [0, 1)), and how long a hang or a full disk lasts."""

    at: float
    kind: str
    pick: float
    hold: float


def plan(seed: int, count: int, kinds: tuple[str, ...], window_s: float) -> list[Planned]:
    """``count`` faults at uniform times in [1, ``window_s``]: every kind of ``kinds`` once
    (while ``count`` allows), the rest drawn among them, shuffled into the times."""
    rng = random.Random(seed * 7919 + 17)
    chosen = list(kinds[:count]) if count >= len(kinds) else rng.sample(list(kinds), count)
    chosen += [rng.choice(kinds) for _ in range(count - len(chosen))]
    rng.shuffle(chosen)
    times = sorted(round(rng.uniform(1.0, max(window_s, 1.0)), 3) for _ in chosen)
    return [Planned(t, k, rng.random(), round(rng.uniform(*HOLDS.get(k, HOLD_S)), 3))
            for t, k in zip(times, chosen)]


@dataclass
class Fault:
    """A fault as the log (``faults.jsonl``) records it."""

    kind: str
    planned: float              # seconds after the schedule started, as planned
    at: float = -1.0            # when injected (same clock); -1: not injected
    unix: float = 0.0
    clock: float | None = None  # the scheduler's clock then (from its state file)
    job: str = ""
    target: str = ""            # 'rank 1 of start 0', 'shard 0', 'fork server', ...
    pid: int = 0
    start: int = -1             # the job's start the target belonged to
    hold: float = 0.0
    outcome: str = "planned"    # 'injected', or 'missed: why'
    detail: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Target:
    job: str
    what: str
    pid: int
    start: int
    driver: int = 0             # the job's driver (a driver-mode job's start is its driver)


def _starts(out: Path, job: str) -> int:
    """The job's start number now: its latest rank record's (ranks) or -1."""
    recs = procs.rank_pids(out / "ranks" / f"{job}.jsonl")
    return max((s for s, _, _ in recs), default=-1)


def rank_targets(table: dict[int, procs.Proc], out: Path, jobs: list[ChaosJob],
                 shards: bool, index: dict[int, dict[int, int]] | None = None) -> list[Target]:
    """The live ranks of every job (``shards``: the parameter servers' shards instead).
    ``index``: a driver's ranks by pid -> rank, as the watch saw them all alive (their
    order alone misnames them once one has died); a PS driver not in it is left out."""
    found = []
    for j in jobs:
        folder = out / "jobs" / j.name
        recs = procs.rank_pids(out / "ranks" / f"{j.name}.jsonl")
        if recs and not shards:       # torchrun-style ranks: their own records
            last = max(s for s, _, _ in recs)
            found += [Target(j.name, f"rank {r} of start {s}", pid, s) for s, r, pid in recs
                      if s == last and procs.live(table, pid)]
            continue
        for d in procs.drivers(table, folder):
            n = j.kind.servers
            if j.kind.ps:
                ranks = {pid: i for pid, i in (index or {}).get(d.pid, {}).items()
                         if procs.live(table, pid)}
                found += [Target(j.name, f"shard {i}" if i < n else f"worker {i - n}", pid,
                                 -1, d.pid) for pid, i in sorted(ranks.items())
                          if (i < n) == shards]
            elif not shards:   # a single-process job trains in its driver
                found.append(Target(j.name, "driver", d.pid, -1, d.pid))
    return found


def fork_server_targets(table: dict[int, procs.Proc], scheduler: int, out: Path,
                        jobs: list[ChaosJob]) -> list[Target]:
    """The scheduler's fork server, while ranks it forked run (else its death shows only
    at the next start)."""
    running = [t for t in rank_targets(table, out, jobs, False) if t.what.startswith("rank ")]
    if not running:
        return []
    names = ",".join(f"{t.job}@{t.start}" for t in sorted(
        {(t.job, t.start): t for t in running}.values(), key=lambda t: t.job))
    return [Target(names, "fork server", s.pid, -1)
            for s in procs.fork_servers(table, scheduler)]


def disk_targets(table: dict[int, procs.Proc], out: Path, victims: list[ChaosJob]
                 ) -> list[Target]:
    """Jobs on a tmpfs that run and have a checkpoint (whose wholeness is then tested)."""
    live = {t.job: t for t in rank_targets(table, out, victims, False)}
    return [Target(j.name, "run folder (tmpfs)", 0, live[j.name].start) for j in victims
            if j.name in live and (out / "jobs" / j.name / "checkpoint.pt").is_file()]


def signal_pid(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def stopped_now(pid: int, timeout_s: float = 2.0) -> bool:
    """Whether ``pid`` shows as stopped (``T``) within ``timeout_s`` of a SIGSTOP."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        t = procs.scan_one(pid)
        if t is None or t == "T":
            return t == "T"
        time.sleep(0.01)
    return False


def fill(folder: Path) -> int:
    """Fill ``folder``'s file system up to :data:`FREE_LEFT` bytes free; the bytes written."""
    st = os.statvfs(folder)
    room = st.f_bavail * st.f_frsize - FREE_LEFT
    if room <= 0:
        return 0
    chunk = b"\0" * (1 << 20)
    written = 0
    with open(folder / FILLER, "wb") as f:
        while written < room:
            n = min(len(chunk), room - written)
            try:
                written += f.write(chunk[:n])
            except OSError:
                break
    return written


def unfill(folder: Path) -> None:
    (folder / FILLER).unlink(missing_ok=True)


def signal_name(sig: int) -> str:
    return signal.Signals(sig).name
