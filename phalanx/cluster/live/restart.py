"""A restartable live scheduler: the loop's state saved as it goes, and a loop rebuilt from
it (``phalanx schedule --resume OUT``). The file format and its checks are :mod:`state`.

What happens to a job's processes when the scheduler dies: they die too. A rank started by
the scheduler dies with its launcher (``PR_SET_PDEATHSIG``: the scheduler itself on the
local engine, its device's actor on Ray, whose actors die with the scheduler that owns
them); a local Slurm cluster dies with the scheduler (its daemons' reaper). So there is
nothing to adopt: a job that ran is resumed from its checkpoint (its last periodic one, as
after any failure: a killed rank writes none), on whatever placement the policy gives it.
On an existing Slurm cluster the ranks (batch jobs) do outlive the scheduler: the engine
stops them as a preemption stops them (they checkpoint at that step), then the job resumes.
A process that did survive (a ``phalanx train`` driver, whose own ranks die with it) is
stopped first, by its pid (SIGTERM, SIGKILL after the grace period), found on this host by
its run folder in its command line; a job that finished while the scheduler was away (its
``summary.json`` written) is done and is not run again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from phalanx.cluster.core.jobs import JobState
from phalanx.cluster.core.scheduler import SchedulerCore
from phalanx.cluster.core.topology import Topology
from phalanx.cluster.live.config import LiveConfig
from phalanx.cluster.live.engines.base import Executor
from phalanx.cluster.live.joblist import LiveJob
from phalanx.cluster.live.state import (
    SERIES,
    STATE_FILE,
    SavedJob,
    SavedState,
    apply_fields,
    cluster_id,
    job_fields,
    jobs_digest,
    save,
    sweep_dead_saves,
)

SAVE_EVERY_S = 1.0      # the clock is saved at least this often, even when nothing changed


@dataclass(frozen=True)
class Progress:
    """What the loop hands the saver beyond the core's job states: its clock, which jobs
    have a gang (and why each is being stopped, '' if it is not), which wait for the next
    round, and how many rounds ran. A value, so that saving reads nothing of the loop."""

    now: float
    running: tuple[int, ...]
    stopping: tuple[str, ...]
    benched: frozenset[int]
    rounds: int
    lost: tuple[str, ...] = ()      # the servers lost now, by name


def snapshot(core: SchedulerCore, jobs: Sequence[LiveJob], topology: Topology, out: Path,
             progress: Progress, pending: Sequence[LiveJob], finished: bool) -> SavedState:
    """The loop's state now (``pending``: the jobs that have not arrived)."""
    res = core.result
    running = set(progress.running)
    saved = {}
    for jid, st in core.states.items():
        status = ("running" if jid in running else "waiting" if jid in core.waiting
                  else "done")
        saved[st.spec.name] = SavedJob(status, st.spec.gpus, job_fields(st),
                                       str(out / "jobs" / st.spec.name))
    name = {j.spec.id: j.spec.name for j in jobs}
    return SavedState(jobs_digest(jobs), cluster_id(topology), progress.now,
                      [name[j] for j in core.waiting],
                      sorted(name[j] for j in progress.benched if j in core.waiting),
                      [j.spec.name for j in pending],
                      [(spec.name, why) for spec, why in res.rejected], saved,
                      {k: list(getattr(res, k)) for k in SERIES}, res.events, finished,
                      sorted(progress.lost))


class Saver:
    """Saves the loop's state when it changed (a job arrived, started, ended, was stopped
    or benched, a round ran) and at least every :data:`SAVE_EVERY_S` seconds."""

    def __init__(self, core: SchedulerCore, jobs: Sequence[LiveJob], topology: Topology,
                 out: Path) -> None:
        self.core, self.jobs, self.topology, self.out = core, jobs, topology, out
        self.path = out / STATE_FILE
        self.key: tuple = ()
        self.at = -float("inf")

    def save(self, progress: Progress, pending: Sequence[LiveJob],
             finished: bool = False) -> None:
        res = self.core.result
        key = (res.events, len(res.times), progress.running, tuple(self.core.waiting),
               progress.benched, progress.rounds, progress.stopping, finished)
        now = time.monotonic()
        if key == self.key and now - self.at < SAVE_EVERY_S:
            return
        save(self.path, snapshot(self.core, self.jobs, self.topology, self.out, progress,
                                 pending, finished))
        self.key, self.at = key, now


@dataclass(frozen=True)
class Restored:
    """What :func:`restore` rebuilt beside the core's queue and states: the jobs still to
    arrive (in arrival order) and the waiting ones that wait for the next round."""

    pending: list[LiveJob]
    benched: frozenset[int]


def restore(core: SchedulerCore, jobs: Sequence[LiveJob], config: LiveConfig,
            executor: Executor, saved: SavedState) -> Restored:
    """Rebuild ``core``'s queue and job states from ``saved``, after stopping what is left
    of the killed scheduler's jobs (the ranks ``executor`` keeps, then any process of this
    host that names a job's folder)."""
    by_name = {j.spec.name: j for j in jobs}
    sweep_dead_saves(config.out)      # a save the killed scheduler was writing
    res = core.result
    res.rejected.extend((by_name[n].spec, why) for n, why in saved.rejected)
    for k, v in saved.series.items():
        getattr(res, k).extend(v)
    res.events = saved.events
    unfinished = [n for n, j in saved.jobs.items() if j.status != "done"]
    gone = dict(executor.stop_leftovers([config.out / "logs" / f"{n}.log" for n in unfinished],
                                        config.grace_s))
    for name, n in stop_leftovers([Path(saved.jobs[n].folder) for n in unfinished],
                                  config.grace_s).items():
        gone[name] = gone.get(name, 0) + n
    # the queue first, in its order: the core keeps its waiting jobs in arrival order
    for name in [*saved.queue, *(n for n in saved.jobs if n not in saved.queue)]:
        sj = saved.jobs[name]
        spec = dataclasses.replace(by_name[name].spec, gpus=sj.gpus)
        finished = sj.status != "done" and (Path(sj.folder) / "summary.json").is_file()
        if sj.status == "done" or finished:
            st = JobState(spec, remaining=0.0)
            apply_fields(st, sj.fields)
            if finished:   # it ended while no scheduler watched: done when we last saw it
                st.end, st.remaining = saved.clock, 0.0
                if len(st.stops) < len(st.placements):
                    st.stops.append(saved.clock)
            core.states[spec.id] = st
            continue
        st = core.submit(spec, sj.fields["waiting_since"])
        if st is None:    # an admission policy refuses it now: as rejected
            continue
        apply_fields(st, sj.fields)
        if sj.status == "running":
            # its ranks died with the scheduler: it waits again, to resume from its checkpoint
            st.waiting_since = st.last_update = saved.clock
            if len(st.stops) < len(st.placements):  # its last placement ended with us
                st.stops.append(saved.clock)
            left = f" (stopped {gone[name]} of its ranks left running)" if gone.get(name) else ""
            line = (f"phalanx: scheduler: {name} was running when the scheduler stopped{left}"
                    "; it resumes from its checkpoint")
            print(line, flush=True)
            with contextlib.suppress(OSError), \
                    open(config.out / "logs" / f"{name}.log", "a") as f:
                f.write(line + "\n")
    pending = sorted((by_name[n] for n in saved.pending), key=lambda j: (j.spec.submit, j.spec.id))
    return Restored(pending, frozenset(by_name[n].spec.id for n in saved.benched))


def processes_of(folder: Path) -> list[int]:
    """Processes of this host whose command line names ``folder`` (a job's run folder)."""
    mark = os.fsencode(str(folder))
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a == mark or a.startswith(mark + b"/") for a in args):
            found.append(int(proc.name))
    return found


def stop_leftovers(folders: Sequence[Path], grace_s: float) -> dict[str, int]:
    """Stop what still runs of the jobs of ``folders`` (SIGTERM to each process's group,
    SIGKILL after ``grace_s``); how many were found per job (by folder name)."""
    found = {f.name: processes_of(f) for f in folders}
    pids = [p for ps in found.values() for p in ps]
    _signal(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pids:
        time.sleep(0.1)
        pids = [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]
        if pids and time.monotonic() > deadline:
            _signal(pids, signal.SIGKILL)
            deadline = float("inf")
    return {k: len(v) for k, v in found.items() if v}


def _signal(pids: list[int], sig: int) -> None:
    """``sig`` to each process's group where it leads one (what it started goes too)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True
