"""Does an injected fault show, at its time, where an operator would look? One check per
kind (the ``faults show`` invariant):

* a kill of a rank, a shard, a single job's process or the fork server: the scheduler
  recorded a start of the job spanning the fault's time, that start ended within
  :data:`KILL_SHOWS_S`, and the scheduler named the failure (its ``failed (...)`` line or
  the job's failure); a PS worker's kill is named by its driver instead (``worker W was
  killed by SIGKILL; the run goes on without it``), unless its run was ending anyway
  (a shard killed just before: the driver names that first cause);
* a hang: the process was seen stopped (``T``) and its rank logged no event while it was;
* ``kill -9`` of the scheduler: the resumed scheduler names every job the state had
  running (``J was running when the scheduler stopped``), and its clock goes on from
  the saved one;
* a full disk: the job's log names its folder in a one-line checkpoint error, unless the
  start had ended before the disk was freed (another fault, or the job's end);
* (Ray) a crashed host, or one cut off past the cluster's verdict on a silent node: the
  scheduler called its server lost (``server S lost``, once per such fault); every job
  with a rank there then (crashed, or cut off past the ranks' lease) ended that start
  within :data:`KILL_SHOWS_S` after the verdict, its failure or its loss named, unless it
  finished first (its summary written before the crash, or under the lease);
* a kill the scheduler could not name because it was itself killed soon after shows as
  the resumed scheduler's ``J was running when the scheduler stopped``."""

from __future__ import annotations

from typing import Any

from phalanx.cluster.chaos.faults import Fault
from phalanx.cluster.chaos.view import RunView

KILL_SHOWS_S = 20.0     # a killed rank's start ends within this (poll, grace, a busy host)
ENDING_S = 10.0         # a PS run already ending when its worker was killed ends this soon
SLACK_S = 0.5           # the fault's clock is read from the state file: within this
FENCE_SLACK_S = 2.0     # a cut-off rank is gone this long after its lease ran out (the
# lease is checked every quarter lease; the watch looks every 0.25 s; a busy machine)


def _spans(sj: dict[str, Any], k: int, clock: float) -> bool:
    """Does start ``k`` of a saved job span ``clock``?"""
    f = sj["fields"]
    stop = f["stops"][k] if k < len(f["stops"]) else float("inf")
    return f["placements"][k][0] - SLACK_S <= clock <= stop + SLACK_S


def _start_at(sj: dict[str, Any], clock: float) -> int | None:
    """Which start of a saved job spans ``clock`` (None: none)."""
    return next((k for k in range(len(sj["fields"]["placements"])) if _spans(sj, k, clock)),
                None)


def _killed(v: RunView, f: Fault, job: str, start: int, jobs: dict[str, Any],
            late_s: float = 0.0) -> list[str]:
    sj = jobs.get(job)
    if sj is None:
        return [f"{f.kind} of {job}: the scheduler has no record of it"]
    starts = sj["fields"]["placements"]
    k = start if 0 <= start < len(starts) else None
    at = _start_at(sj, f.clock) if f.clock is not None else None
    if at is not None and (k is None or not _spans(sj, k, f.clock)):
        k = at   # the clock names it: the watch counts a driver's starts as it sees
        # them, and misses one shorter than its look (a start that died at once)
    if k is None:
        return [f"{f.kind} of {job} at {f.at:.2f} s (start {start}, clock {f.clock}): no "
                "start of it spans that time"]
    stops = sj["fields"]["stops"]
    named = f"{job} failed (" in v.stdout or bool(sj["fields"]["failure"]) or (
        f"{job} stopped: server(s) " in v.stdout) or any(
        " lost: " in ln and job in ln.partition("; ")[2].replace(",", " ").split()
        for ln in v.stdout.splitlines()) or (
        k < len(stops) and _scheduler_killed_first(v, f, job, stops[k]))
    if f.target.startswith("worker "):
        line = f"{f.target} was killed by SIGKILL"
        # the run was ending anyway (a shard killed just before): the start ended soon
        # after, not by finishing, and its driver named that first cause
        ended_badly = k + 1 < len(starts) or bool(sj["fields"]["failure"])
        ending = (k < len(stops) and f.clock is not None and ended_badly
                  and stops[k] <= f.clock + ENDING_S)
        return [] if line in v.log(job) or ending else [
            f"{f.kind} of {job} ({f.target}): its log lacks '{line}'"]
    bad = []
    if k >= len(stops):
        bad.append(f"{f.kind} of {job}: start {k} never ended")
    elif f.clock is not None and not (f.clock - SLACK_S <= stops[k]
                                      <= f.clock + KILL_SHOWS_S + late_s):
        bad.append(f"{f.kind} of {job} at clock {f.clock:.2f} s: start {k} ended at "
                   f"{stops[k]:.2f} s, not within {KILL_SHOWS_S + late_s:g} s after")
    if not named:
        bad.append(f"{f.kind} of {job}: the scheduler never named a failure of it")
    return bad


def _hung(v: RunView, f: Fault) -> list[str]:
    if not f.detail.get("seen_stopped"):
        return [f"stop-rank of {f.job} ({f.target}): never seen stopped"]
    sj = v.state()["jobs"].get(f.job)
    stops = sj["fields"]["stops"] if sj is not None else []
    if f.clock is not None and 0 <= f.start < len(stops) and stops[f.start] < f.clock + f.hold:
        return []   # the start ended while it hung: later events are the next start's
    rank = f.detail.get("event_rank")
    during = [e for e in v.events(f.job) if e.get("rank") == rank
              and f.unix + 0.1 < e.get("unix", 0) < f.unix + f.hold - 0.1]
    return [f"stop-rank of {f.job} ({f.target}): {len(during)} event(s) logged while it was "
            "stopped"] if during else []


def _scheduler(v: RunView, f: Fault) -> list[str]:
    bad = []
    for job in v.seen.running_at(f.unix):
        said = f"{job} was running when the scheduler stopped" in v.stdout
        if not said and not (v.out / "jobs" / job / "summary.json").is_file():
            bad.append(f"kill-scheduler at {f.at:.2f} s: the resumed scheduler never named "
                       f"{job}, which was running")
    before = [c for u, c, _ in v.seen.clocks if u <= f.unix]
    after = [c for u, c, _ in v.seen.clocks if u > f.unix]
    if before and after and after[0] < before[-1]:
        bad.append(f"kill-scheduler at {f.at:.2f} s: the clock went back from "
                   f"{before[-1]:.2f} to {after[0]:.2f} s")
    return bad


def _disk(v: RunView, f: Fault, jobs: dict[str, Any]) -> list[str]:
    if f"jobs/{f.job}: cannot write checkpoint" in v.log(f.job):
        return []
    sj = jobs.get(f.job)
    k = f.start if sj is not None and 0 <= f.start < len(sj["fields"]["placements"]) else None
    stops = sj["fields"]["stops"] if sj is not None else []
    if k is not None and k < len(stops) and f.clock is not None and stops[k] < f.clock + f.hold:
        return []    # the start ended before the disk was freed: no write was due
    return [f"disk-full of {f.job} at {f.at:.2f} s (held {f.hold:g} s): no checkpoint error "
            "naming its folder in its log"]


def _host(v: RunView, f: Fault, jobs: dict[str, Any]) -> list[str]:
    d = f.detail
    latest = d["silent_s"][1]
    down = d.get("up_unix", f.unix + f.hold) - f.unix
    bad = []

    def lost_due(g: Fault) -> bool:
        return g.kind == "crash-host" or g.detail.get("up_unix", g.unix + g.hold) - g.unix \
            > latest + SLACK_S

    if lost_due(f):
        # every fault on this server that cost its node, up to this one: as many verdicts
        due = sum(1 for g in v.faults if g.outcome == "injected" and g.unix <= f.unix
                  and g.kind in ("crash-host", "cut-link")
                  and g.detail.get("server") == d["server"] and lost_due(g))
        said = v.stdout.count(f"phalanx: scheduler: server {d['server']} lost")
        if said < due:
            bad.append(f"{f.kind} of host {d['host']} at {f.at:.2f} s: server {d['server']} "
                       f"called lost {said} time(s), {due} expected by then")
    if f.kind == "crash-host" or down > d["fence_s"] + SLACK_S + 1.5:
        hit = [(j, int(s)) for j, _, s in (x.rpartition("@") for x in f.job.split(",") if x)]
        # what a crash may still find finished: a summary written up to the crash; under a
        # cut the ranks run on until their lease is out, and may finish meanwhile
        by = f.unix + (SLACK_S if f.kind == "crash-host" else d["fence_s"] + FENCE_SLACK_S)
        bad += [m for job, start in hit if not _finished_by(v, job, start, jobs, by)
                for m in _killed(v, f, job, start, jobs, late_s=d["verdict_s"])]
    return bad


def _finished_by(v: RunView, job: str, start: int, jobs: dict[str, Any], unix: float) -> bool:
    """``start`` was the job's last and the job finished, its summary written by ``unix``."""
    sj = jobs.get(job)
    if sj is None or sj["fields"]["failure"] or start != len(sj["fields"]["placements"]) - 1:
        return False
    summary = v.out / "jobs" / job / "summary.json"
    return summary.is_file() and summary.stat().st_mtime <= unix


def _scheduler_killed_first(v: RunView, f: Fault, job: str, stop: float) -> bool:
    """The scheduler was killed soon after ``f``, before it named the failure: the state it
    last saved had the job running, and the start hit ended at the resume (``stop``: at
    that save's clock), which named the job as running when the scheduler stopped."""
    for g in v.faults:
        if g.kind != "kill-scheduler" or g.outcome != "injected" or not (
                f.unix <= g.unix <= f.unix + KILL_SHOWS_S):
            continue
        saved = [c for u, c, _ in v.seen.clocks if u <= g.unix]
        if (saved and job in v.seen.running_at(g.unix) and stop >= saved[-1] - SLACK_S
                and f"{job} was running when the scheduler stopped" in v.stdout):
            return True
    return False


def shows(v: RunView, f: Fault) -> list[str]:
    """The reasons ``f`` does not show (empty: it does)."""
    jobs = v.state()["jobs"]
    if f.kind == "kill-scheduler":
        return _scheduler(v, f)
    if f.kind == "disk-full":
        return _disk(v, f, jobs)
    if f.kind == "stop-rank":
        return _hung(v, f)
    if f.kind in ("crash-host", "cut-link"):
        return _host(v, f, jobs)
    if f.kind == "kill-fork-server":    # every job whose ranks it had forked: job@start
        hit = [(j, int(s)) for j, _, s in (x.rpartition("@") for x in f.job.split(","))]
    else:
        hit = [(f.job, f.start)]
    return [m for job, start in hit for m in _killed(v, f, job, start, jobs)]
