"""The invariants of a chaos run, each a function of what the run left (:class:`RunView`)
returning its violations (empty: kept). :data:`INVARIANTS` lists them in the order the
report prints them."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import torch

from phalanx.cluster.chaos import procs
from phalanx.cluster.chaos.faults import FILLER
from phalanx.cluster.chaos.shows import FENCE_SLACK_S, shows
from phalanx.cluster.chaos.view import RunView
from phalanx.cluster.live.state import STATE_FILE
from phalanx.runtime.checkpoint import CheckpointError, load_checkpoint


def every_job_ends_once(v: RunView) -> list[str]:
    """Every job of the list ends finished or failed with a reason, in the state and in
    jobs.csv; none is lost."""
    try:
        state = v.state()
    except (OSError, ValueError) as e:
        return [f"{STATE_FILE}: {e}"]
    bad = [] if state.get("finished") is True else ["the schedule's state says it did not end"]
    for j in v.jobs:
        sj = state["jobs"].get(j.name)
        if sj is None:
            bad.append(f"{j.name}: not in the state (lost)")
            continue
        f = sj["fields"]
        if sj["status"] != "done" or f["end"] < 0:
            bad.append(f"{j.name}: status {sj['status']}, end {f['end']} (never ended)")
        elif not f["failure"] and not (v.out / "jobs" / j.name / "summary.json").is_file():
            bad.append(f"{j.name}: finished without a summary.json")
    try:
        rows = (v.out / "jobs.csv").read_text().splitlines()[1:]
    except OSError:
        return [*bad, "no jobs.csv"]
    names = [r.split(",")[1] for r in rows]
    for j in v.jobs:
        if names.count(j.name) != 1:
            bad.append(f"{j.name}: {names.count(j.name)} rows in jobs.csv")
    for r in rows:
        if re.search(r",(finished|failed: .+?)(,|$)", r) is None:
            bad.append(f"jobs.csv row without 'finished' or 'failed: reason': {r[:120]}")
    return bad


def never_twice_at_once(v: RunView) -> list[str]:
    """No job runs twice at once: the scheduler's starts of a job never overlap (each
    stop before the next start), and the watch never saw two starts' ranks or two
    drivers of one job alive together."""
    bad = list(v.seen.twice)
    try:
        jobs = v.state()["jobs"]
    except (OSError, ValueError):
        return bad
    for name, sj in jobs.items():
        starts = [t for t, _ in sj["fields"]["placements"]]
        stops = sj["fields"]["stops"]
        if len(stops) != len(starts):
            bad.append(f"{name}: {len(starts)} starts but {len(stops)} stops")
        for k, (a, b) in enumerate(zip(starts, stops)):
            nxt = starts[k + 1] if k + 1 < len(starts) else float("inf")
            if not a <= b <= nxt + 1e-6:
                bad.append(f"{name}: start {k} runs {a:.2f}..{b:.2f} s, next start {nxt:.2f} s")
    return bad


def same_as_uninterrupted(v: RunView) -> list[str]:
    """Every finished job of a kind with a reference ends with its reference's final
    parameters, bit for bit."""
    bad = []
    state = v.state()["jobs"]
    for j in v.jobs:
        ref = v.references.get(j.kind.name)
        if ref is None or state.get(j.name, {}).get("fields", {}).get("failure", "x"):
            continue
        try:
            got = load_checkpoint(v.out / "jobs" / j.name / "checkpoint.pt")["model"]
            want = load_checkpoint(ref / "checkpoint.pt")["model"]
        except (CheckpointError, KeyError) as e:
            bad.append(f"{j.name}: {e}")
            continue
        diff = [k for k in want if k not in got or not torch.equal(got[k], want[k])]
        if diff or got.keys() != want.keys():
            bad.append(f"{j.name}: final parameters differ from an uninterrupted run's "
                       f"({', '.join(diff[:3]) or 'other tensors'})")
    return bad


def updates_applied_once(v: RunView) -> list[str]:
    """Every parameter-server job: on each shard the updates that made the final model
    (each resume cuts the shard's history back to the version it restored: updates after
    its last checkpoint are lost and redone) are versions 0, 1, 2, ... with no gap, each
    worker's push (worker, clock) in them at most once, and their number is the shard's
    final version (its last ``apply``)."""
    bad = []
    for j in v.jobs:
        if not j.kind.ps:
            continue
        history: dict[int, list[list[tuple[int, int]]]] = {}
        for e in v.events(j.name):
            if e.get("role") != "server" or "shard" not in e:
                continue
            h = history.setdefault(e["shard"], [])
            if e["kind"] == "resume":
                if e["version"] > len(h):
                    bad.append(f"{j.name}: shard {e['shard']} restored version {e['version']}"
                               f" but had applied {len(h)}")
                del h[e["version"]:]
            elif e["kind"] == "apply":
                ver, push = e["version"], (e["worker"], e["clock"])
                if ver == len(h):
                    h.append([push])
                elif ver == len(h) - 1 and len(h[-1]) < e.get("batch", 1):
                    h[-1].append(push)   # one more push of the same batched update
                else:
                    bad.append(f"{j.name}: shard {e['shard']} applied version {ver} after "
                               f"{len(h)} (a gap or an update applied twice)")
        for shard, h in history.items():
            pushes = [p for batch in h for p in batch]
            twice = sorted({p for p in pushes if pushes.count(p) > 1})
            if twice:
                bad.append(f"{j.name}: shard {shard}: pushes (worker, clock) applied twice: "
                           f"{twice[:3]}")
    return bad


def resumes_from_the_last_checkpoint(v: RunView) -> list[str]:
    """A resume never skips a checkpoint: what a sync job's ranks or a shard restore is at
    least the last checkpoint the job logged before it (a checkpoint is logged once it is
    on disk)."""
    bad = []
    for j in v.jobs:
        last: dict[str, int] = {}
        for e in v.events(j.name):
            if e["kind"] not in ("checkpoint", "resume"):
                continue
            if e.get("role") == "server" and "shard" in e:
                key, at = f"shard {e['shard']}", e.get("version")
            elif "worker" in e:
                continue        # a PS worker continues from the clocks its shards restored
            else:
                key, at = "ranks", e.get("step")
            if not isinstance(at, int):
                continue
            if e["kind"] == "checkpoint":
                last[key] = max(last.get(key, -1), at)
            elif at < last.get(key, -1):
                bad.append(f"{j.name}: {key} resumed at {at}, its last checkpoint was at "
                           f"{last[key]}")
    return bad


def checkpoints_whole(v: RunView) -> list[str]:
    """No checkpoint on disk is partial or corrupt: each loads, and no temp file is left
    (a checkpoint's ``.NAME.tmpPID``, the state's ``.scheduler-state.json.PID.tmp``)."""
    bad = []
    for path in sorted(v.out.rglob("*")):
        if path.name.endswith((".pt", ".ckpt")) and path.is_file():
            try:
                load_checkpoint(path)
            except CheckpointError as e:
                bad.append(str(e))
        elif ".tmp" in path.name or path.name == FILLER:
            bad.append(f"{path.relative_to(v.out)}: left behind")
    return bad


def state_always_loads(v: RunView) -> list[str]:
    """``scheduler-state.json`` loaded with ``--resume``'s checks at every look during the
    run and at the end."""
    bad = list(v.seen.bad_state)
    if v.seen.loads == 0:
        bad.append("the state file was never seen")
    return bad


def nothing_left(v: RunView) -> list[str]:
    """No process of the run is left (on any test host: the machine's ``/proc`` shows
    them all), no device actor of it on a test host, no ``/dev/shm/phalanx-*`` entry its
    drivers made, nothing in its private temp folder."""
    table = procs.scan()
    bad = [f"process {p} ({' '.join(table[p].argv)[:80]}) left running"
           for p in sorted(v.seen.pids) if procs.live(table, p)]
    bad += [f"process {p} ({' '.join(table[p].argv)[:80]}) left running"
            for p in procs.mentioning(table, str(v.out)) if p not in v.seen.pids]
    for entry in sorted(Path("/dev/shm").glob("phalanx-*")):
        m = re.search(r"-(\d+)", entry.name[len("phalanx-"):])
        if entry.name not in v.shm_before and m and int(m.group(1)) in v.seen.drivers:
            bad.append(f"/dev/shm/{entry.name} left behind")
    bad += v.left_on_hosts    # Ray: a device actor of the run still on a test host
    if v.tmpdir is not None and v.tmpdir.is_dir():
        # torch's compile cache (an empty torchinductor_USER, made as torch loads) is
        # meant to outlive a run; anything else there is the run's
        bad += [f"{p} left in the run's TMPDIR" for p in sorted(v.tmpdir.iterdir())
                if not p.name.startswith("torchinductor_")]
    return bad




def no_rank_on_a_fenced_host(v: RunView) -> list[str]:
    """(Ray) While a test host is cut off, no process of the run is seen in it once its
    lease has run out (``ray_fence``: the host's actors kill their ranks ``fence_s`` after
    the GCS last said "alive"), until the link is back."""
    bad = []
    for f in v.faults:
        if f.kind != "cut-link" or f.outcome != "injected":
            continue
        host, fence = f.detail["host"], f.detail["fence_s"]
        lo, hi = f.unix + fence + FENCE_SLACK_S, f.detail.get("up_unix", f.unix + f.hold)
        seen = sorted({p for t, where in v.seen.on_host if lo <= t <= hi
                       for p in where.get(host, [])})
        if seen:
            bad.append(f"cut-link of host {host} at {f.at:.2f} s (down {hi - f.unix:.1f} s, "
                       f"lease {fence:g} s): processes {seen[:6]} of the run still ran there "
                       f"{lo - f.unix:.1f} s after the cut")
    return bad


def faults_show(v: RunView) -> list[str]:
    """Every injected fault shows, at its time, in the scheduler's record and logs
    (:func:`phalanx.cluster.chaos.shows.shows`, kind by kind)."""
    return [m for f in v.faults if f.outcome == "injected" for m in shows(v, f)]


Invariant = Callable[[RunView], list[str]]
INVARIANTS: dict[str, Invariant] = {
    "every job ends once": every_job_ends_once,
    "never twice at once": never_twice_at_once,
    "same as uninterrupted": same_as_uninterrupted,
    "updates applied once": updates_applied_once,
    "resumes from the last checkpoint": resumes_from_the_last_checkpoint,
    "checkpoints whole": checkpoints_whole,
    "state always loads": state_always_loads,
    "nothing left": nothing_left,
    "no rank on a fenced host": no_rank_on_a_fenced_host,
    "faults show": faults_show,
}


def check(v: RunView) -> dict[str, list[str]]:
    """Every invariant's violations (an invariant that raises is one violation)."""
    out = {}
    for name, fn in INVARIANTS.items():
        try:
            out[name] = fn(v)
        except Exception as e:   # noqa: BLE001 - a checker's crash is a finding too
            out[name] = [f"the check failed: {type(e).__name__}: {e}"]
    return out
