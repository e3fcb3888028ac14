"""One measurement of ``phalanx interference profile``: start real ``phalanx train`` jobs,
each pinned to one core, wait until every one has warmed up, count each job's samples over
one shared wall-clock window, and stop them all — nothing is left running, however the
measurement ends (an error, a job that died, Ctrl-C of the profiler).

A job is one process pinned to one core, or (level ``link``) one process per rank, each in a
test host of its own (``ip netns exec``) and pinned to that host's core, its ranks talking
over the hosts' shaped link (:class:`RankStart`).

A job's samples come from its own ``events.jsonl`` (docs/events.md): every computing rank
logs a ``train`` event every 10 steps with ``samples``, its own batches so far, and
``unix``, the wall clock. A rank's cumulative samples are interpolated linearly between its
events at the window's two edges; the job's rate is the sum over its ranks (data-parallel
workers draw distinct batches) over the window's length.
"""

from __future__ import annotations

import bisect
import ctypes
import functools
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from phalanx.errors import PhalanxError

POLL_S = 0.1
SETTLE_S = 0.5     # after the last job warmed up, before the window opens
PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


class ProfileError(PhalanxError):
    """A job of the profile misbehaved (ended early, never warmed up): one line naming
    its class."""


@dataclass(frozen=True, kw_only=True)
class WindowOptions:
    seconds: float            # the measured window
    warmup_steps: int         # steps every rank of a job has logged before the window
    startup_timeout_s: float  # start -> warmed up, per measurement
    grace_s: float            # SIGTERM -> SIGKILL


@dataclass(frozen=True, kw_only=True)
class RankStart:
    """One process of a job whose ranks are started one by one (on test hosts)."""

    prefix: tuple[str, ...]               # what runs it in its host (``ip netns exec H``)
    core: int                             # the core it may use
    env: tuple[tuple[str, str], ...]      # its rank's environment (RANK, MASTER_ADDR, ...)


@dataclass(frozen=True, kw_only=True)
class JobStart:
    name: str                 # the job class (error messages name it)
    argv: tuple[str, ...]     # the whole command; its run folder is ``--out RUN``
    core: int                 # the one core it and every process it starts may use
    ranks: int                # ranks that log ``train`` events (its workers)
    env: tuple[tuple[str, str], ...] = (("OMP_NUM_THREADS", "1"),)
    # one process per rank, each ``prefix + argv`` on its own core (empty: one process,
    # ``argv`` on ``core``, that starts its own ranks)
    spread: tuple[RankStart, ...] = ()


def _child_setup(core: int) -> None:
    """In the child, before exec: pin it (every process it forks inherits the mask) and
    have it stopped with SIGTERM if the profiler dies without stopping it."""
    os.sched_setaffinity(0, {core})
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def session_pids(sid: int) -> list[int]:
    """Living (not zombie) processes of session ``sid``: a job's driver, its fork server
    and its ranks, whatever process group they ended up in."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and fields[0] != "Z" and int(fields[3]) == sid:
            out.append(int(p.name))
    return out


class Job:
    """One running job: its processes (one, or one per rank on test hosts), each in a
    session of its own and pinned, and what its events said so far (``samples`` per rank
    against the wall clock)."""

    def __init__(self, start: JobStart, folder: Path) -> None:
        self.start, self.name = start, start.name
        folder.mkdir(parents=True, exist_ok=True)
        self.events = folder / "run" / "events.jsonl"
        self.log = folder / "job.log"
        self.points: dict[int, list[tuple[float, float]]] = {}
        self.last_step: dict[int, int] = {}
        self._offset, self._partial = 0, b""
        procs = start.spread or (RankStart(prefix=(), core=start.core, env=()),)
        self.popens: list[subprocess.Popen] = []
        with open(self.log, "ab") as out:
            for p in procs:
                self.popens.append(subprocess.Popen(
                    [*p.prefix, *start.argv, "--out", str(folder / "run")], stdout=out,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env={**os.environ, **dict(start.env), **dict(p.env)},
                    start_new_session=True,
                    preexec_fn=functools.partial(_child_setup, p.core)))
        self.pids = [p.pid for p in self.popens]

    def poll(self) -> int | None:
        """The exit status of its first process that ended (a rank gone ends the job), or
        None while all run."""
        return next((rc for rc in (p.poll() for p in self.popens) if rc is not None), None)

    def wait(self) -> None:
        for p in self.popens:
            p.wait()

    def read(self) -> None:
        """Take in the events appended since the last read (whole lines only)."""
        try:
            with open(self.events, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for line in lines:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("kind") != "train" or not isinstance(e.get("samples"), (int, float)):
                continue
            rank = int(e.get("rank", 0))
            self.points.setdefault(rank, []).append((float(e["unix"]), float(e["samples"])))
            self.last_step[rank] = int(e.get("step", 0))

    def warm(self, steps: int) -> bool:
        return sum(1 for s in self.last_step.values() if s >= steps) >= self.start.ranks

    def reported_after(self, t: float) -> bool:
        return len(self.points) >= self.start.ranks and all(
            pts[-1][0] >= t for pts in self.points.values())

    def samples_at(self, t: float) -> float:
        """Samples of all its ranks at wall-clock ``t`` (each rank's curve interpolated
        linearly between its two events around ``t``; clamped at its first and last)."""
        total = 0.0
        for pts in self.points.values():
            i = bisect.bisect_left(pts, (t, float("-inf")))
            if i == 0:
                total += pts[0][1]
            elif i == len(pts):
                total += pts[-1][1]
            else:
                (u0, s0), (u1, s1) = pts[i - 1], pts[i]
                total += s0 + (s1 - s0) * ((t - u0) / (u1 - u0) if u1 > u0 else 1.0)
        return total

    def last_line(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1][:300] if lines else ""

    def alive(self) -> bool:
        return any(p.poll() is None for p in self.popens) or any(
            session_pids(pid) for pid in self.pids)

    def signal(self, sig: int) -> None:
        """``sig`` to its processes' groups and to anything else left in their sessions."""
        for pid in self.pids:
            for send, target in ((os.killpg, pid),
                                 *((os.kill, p) for p in session_pids(pid))):
                try:
                    send(target, sig)
                except (ProcessLookupError, PermissionError):
                    pass


def stop_jobs(jobs: Sequence[Job], grace_s: float) -> None:
    """SIGTERM every job's group (each stops its ranks), SIGKILL what is left after
    ``grace_s`` (or at once on a second Ctrl-C), then reap: nothing survives."""
    try:
        for j in jobs:
            j.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(j.alive() for j in jobs) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for j in jobs:
            if j.alive():
                j.signal(signal.SIGKILL)
        for j in jobs:
            j.wait()


def _wait(jobs: Sequence[Job], done: Callable[[Job], bool], allowed_s: float,
          what: str) -> None:
    """Poll until ``done`` holds for every job; a job that ended, or ``allowed_s`` passing,
    is a :class:`ProfileError` naming the job's class and ``what`` it was waiting for."""
    until = time.time() + allowed_s
    while True:
        for j in jobs:
            j.read()
        if all(done(j) for j in jobs):
            return
        for j in jobs:
            rc = j.poll()
            if rc is not None:
                raise ProfileError(f"{j.name}: the job ended (exit {rc}) before its {what}: "
                                   f"{j.last_line() or 'no output'}")
        if time.time() >= until:
            late = next(j for j in jobs if not done(j))
            raise ProfileError(f"{late.name}: still no {what} after {allowed_s:g} s: "
                               f"{late.last_line() or 'no output'}")
        time.sleep(POLL_S)


def measure(starts: Sequence[JobStart], opts: WindowOptions, workdir: Path) -> list[float]:
    """Samples/s of each job of ``starts``, all running side by side, over the same
    ``opts.seconds`` window, once each has done ``opts.warmup_steps`` steps."""
    jobs: list[Job] = []
    try:
        for i, s in enumerate(starts):
            jobs.append(Job(s, workdir / f"{i}-{s.name}"))
        _wait(jobs, lambda j: j.warm(opts.warmup_steps), opts.startup_timeout_s,
              f"warm-up ({opts.warmup_steps} steps on each of its ranks)")
        time.sleep(SETTLE_S)
        t0 = time.time()
        t1 = t0 + opts.seconds
        # the window: only a job that ends is looked at (reading events costs CPU)
        while time.time() < t1:
            for j in jobs:
                rc = j.poll()
                if rc is not None:
                    raise ProfileError(f"{j.name}: the job ended (exit {rc}) inside the "
                                       f"window: {j.last_line() or 'no output'}")
            time.sleep(min(POLL_S * 5, max(0.0, t1 - time.time())))
        # each rank's first event after the window closes its curve there
        _wait(jobs, lambda j: j.reported_after(t1), max(10.0, opts.seconds),
              "step event after the window")
        rates = [(j.samples_at(t1) - j.samples_at(t0)) / (t1 - t0) for j in jobs]
    finally:
        stop_jobs(jobs, opts.grace_s)
    for j, r in zip(jobs, rates):
        if r <= 0:
            raise ProfileError(f"{j.name}: no samples in the window")
    return rates
