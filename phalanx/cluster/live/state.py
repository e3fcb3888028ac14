"""The live scheduler's state on disk (``OUT/scheduler-state.json``), so that ``phalanx
schedule --resume OUT`` continues a job list after the scheduler died, even by ``kill -9``.

What is saved, after every change the loop makes (and at least every second, for the
clock): the clock (seconds since the schedule began), the queue in its order, the jobs a
round benched, the jobs not yet arrived, the rejected ones, the run's series, and each
admitted job's state (status, attained service, executed time, starts, preemptions,
restarts, every placement, its failure line, its gang size, its run folder), and the
servers the engine reports lost at that moment (read by the dashboard; a resume asks the
engine again).

* **Atomic.** The text goes to a temporary file in the same folder, is flushed to disk and
  then renamed over the state (``os.replace``): a reader sees the old state or the new one,
  never half of one, whenever the writer dies.
* **Checked on load.** A file that is not this format, another version, or whose values
  have the wrong types is refused with one line naming it (:class:`ConfigError`, exit 2);
  so is a state written for another job list or another cluster (a digest of the list's
  entries, the cluster's servers).

The state says nothing about processes: a job that was running when the scheduler died is
resumed from its run folder's checkpoint (see ``docs/cluster.md``, "Restarting the
scheduler", for why the engines' ranks never outlive their scheduler).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.cluster.core.jobs import JobState
from phalanx.cluster.core.topology import Topology
from phalanx.cluster.live.joblist import LiveJob
from phalanx.errors import ConfigError

STATE_FILE = "scheduler-state.json"
FORMAT = "phalanx-schedule-state"
VERSION = 1
STATUSES = ("waiting", "running", "done")
# the JobState fields saved for every admitted job (``spec`` is the list's, ``gpus`` saved
# apart: an elastic policy may have changed it); the simulator's own fields are left out
SAVED = ("remaining", "attained", "executed", "start", "end", "waiting_since", "last_start",
         "preemptions", "last_update", "placements", "failure", "restarts", "stops")
OPTIONAL = {"stops"}  # fields a state written before them lacks (loaded as empty)
SERIES = ("times", "busy", "queue", "frag")


@dataclass(frozen=True)
class SavedJob:
    """One admitted job as the scheduler last saw it."""

    status: str                     # 'waiting' (queued), 'running' (held devices), 'done'
    gpus: int
    fields: dict[str, Any]          # the :data:`SAVED` fields of its ``JobState``
    folder: str                     # its run folder (OUT/jobs/NAME)


@dataclass(frozen=True)
class SavedState:
    """Everything ``--resume`` needs (see the module's docstring)."""

    jobs_digest: str
    cluster: list[str]
    clock: float
    queue: list[str]                # waiting jobs, in queue order
    benched: list[str]
    pending: list[str]              # not arrived yet
    rejected: list[tuple[str, str]]
    jobs: dict[str, SavedJob]
    series: dict[str, list[float]] = field(default_factory=dict)
    events: int = 0
    finished: bool = False          # the run ended (nothing is left to continue)
    # servers the engine reports lost now, by name: for whoever reads the file (the
    # dashboard draws them lost); a resume asks the engine again. Optional on load, so a
    # state written before it existed still resumes
    lost: list[str] = field(default_factory=list)


def jobs_digest(jobs: Sequence[LiveJob]) -> str:
    """The job list's identity: every entry's name, arrival, gang, duration and settings."""
    rows = sorted([j.spec.name, j.spec.submit, j.spec.gpus, j.spec.duration, j.config]
                  for j in jobs)
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()


def cluster_id(topology: Topology) -> list[str]:
    """The cluster's identity: its servers, each with its devices (placements name them)."""
    return [f"{s.name}:{s.num_devices}" for s in topology.servers]


def job_fields(st: JobState) -> dict[str, Any]:
    out = {k: getattr(st, k) for k in SAVED}
    out["placements"] = [[t, list(d)] for t, d in st.placements]
    out["stops"] = list(st.stops)
    return out


def apply_fields(st: JobState, saved: dict[str, Any]) -> None:
    for k in SAVED:
        setattr(st, k, saved.get(k, []) if k in OPTIONAL else saved[k])
    st.placements = [(float(t), tuple(int(d) for d in devs)) for t, devs in saved["placements"]]


def to_json(state: SavedState) -> dict[str, Any]:
    d = dataclasses.asdict(state)
    d["rejected"] = [list(r) for r in state.rejected]
    # the wall time the clock reads ``clock`` at (to within the write): who reads the file
    # beside the jobs' own events (live/colocation.py) maps the clock onto theirs
    return {"format": FORMAT, "version": VERSION, **d, "unix": time.time()}


def save(path: Path, state: SavedState) -> None:
    """Write ``state`` to ``path`` atomically (temp file, fsync, ``os.replace``)."""
    text = json.dumps(to_json(state), separators=(",", ":"))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def sweep_dead_saves(out: Path) -> list[str]:
    """Remove the temp files (``.scheduler-state.json.PID.tmp``) of saves whose writer is
    dead: a scheduler killed (SIGKILL) while it saved leaves one for good (``phalanx chaos
    --engine ray``, seed 204). A live writer's are left alone. Their names."""
    removed = []
    for path in out.glob(f".{STATE_FILE}.*.tmp"):
        pid = path.name[len(STATE_FILE) + 2:-len(".tmp")]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


# ---------------------------------------------------------------------- loading
def _bad(path: Path, why: str) -> ConfigError:
    return ConfigError(f"--resume {path.parent}: {path.name} {why}; it cannot be resumed")


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _strings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _check_fields(f: Any) -> bool:
    if not isinstance(f, dict) or set(f) not in (set(SAVED), set(SAVED) - OPTIONAL):
        return False
    ints = ("preemptions", "restarts")
    if not all(_num(f[k]) for k in SAVED if k not in ("placements", "failure", "stops")):
        return False
    if not (isinstance(f.get("stops", []), list) and all(_num(t) for t in f.get("stops", []))):
        return False
    if not all(isinstance(f[k], int) and f[k] >= 0 for k in ints):
        return False
    return isinstance(f["failure"], str) and isinstance(f["placements"], list) and all(
        isinstance(p, list) and len(p) == 2 and _num(p[0]) and isinstance(p[1], list)
        and all(isinstance(d, int) and not isinstance(d, bool) for d in p[1])
        for p in f["placements"])


def _parse(path: Path, d: Any) -> SavedState:
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise _bad(path, "is not a phalanx schedule state")
    if d.get("version") != VERSION:
        raise _bad(path, f"has version {d.get('version')!r}, this phalanx reads {VERSION}")
    keys = {f.name for f in dataclasses.fields(SavedState)}
    # "unix" (optional: a state written before it existed) is for other readers
    if set(d) - {"format", "version", "unix"} not in (keys, keys - {"lost"}):
        raise _bad(path, "is corrupt (missing or unknown fields)")
    lost = d.get("lost", [])
    jobs = d["jobs"]
    ok = (isinstance(d["jobs_digest"], str) and _strings(d["cluster"]) and _num(d["clock"])
          and d["clock"] >= 0 and _strings(d["queue"]) and _strings(d["benched"])
          and _strings(d["pending"]) and isinstance(d["rejected"], list)
          and all(isinstance(r, list) and len(r) == 2 and _strings(r) for r in d["rejected"])
          and _strings(lost) and isinstance(jobs, dict) and isinstance(d["events"], int)
          and isinstance(d["finished"], bool) and isinstance(d["series"], dict)
          and set(d["series"]) <= set(SERIES)
          and all(isinstance(v, list) and all(_num(x) for x in v)
                  for v in d["series"].values()))
    if ok:
        for j in jobs.values():
            ok = ok and (isinstance(j, dict) and set(j) == {"status", "gpus", "fields", "folder"}
                         and j["status"] in STATUSES and isinstance(j["gpus"], int)
                         and j["gpus"] >= 1 and isinstance(j["folder"], str)
                         and _check_fields(j["fields"]))
    if not ok:
        raise _bad(path, "is corrupt (a value of the wrong type)")
    return SavedState(d["jobs_digest"], d["cluster"], float(d["clock"]), d["queue"],
                      d["benched"], d["pending"], [(a, b) for a, b in d["rejected"]],
                      {n: SavedJob(**j) for n, j in jobs.items()}, d["series"], d["events"],
                      d["finished"], lost)


def load(out: Path, jobs: Sequence[LiveJob], topology: Topology, jobs_source: str
         ) -> SavedState:
    """The state in ``out``, checked: its format and version, its values, and that it was
    written for this job list and this cluster (one-line :class:`ConfigError` otherwise)."""
    path = out / STATE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"--resume {out}: no {STATE_FILE} there (not the --out of a "
                          "phalanx schedule run)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise _bad(path, f"cannot be read ({getattr(e, 'strerror', None) or e})") from None
    try:
        d = json.loads(text)
    except (ValueError, RecursionError):
        raise _bad(path, "is corrupt (not JSON)") from None
    state = _parse(path, d)
    if state.jobs_digest != jobs_digest(jobs):
        raise ConfigError(f"--jobs {jobs_source}: not the job list {out} was scheduled with "
                          "(--resume continues the same list)")
    if state.cluster != cluster_id(topology):
        raise ConfigError(f"--cluster {topology.name}: not the cluster {out} was scheduled "
                          f"on ({', '.join(state.cluster)})")
    names = {j.spec.name for j in jobs}
    listed = [*state.jobs, *state.pending, *(n for n, _ in state.rejected)]
    if set(listed) != names or len(listed) != len(names) or not (
            set(state.queue) | set(state.benched)) <= set(state.jobs):
        raise _bad(path, "is corrupt (its jobs are not the list's)")
    return state


def unfinished(out: Path) -> bool:
    """``out`` holds the state of a schedule that did not end (killed or interrupted)."""
    try:
        d = json.loads((out / STATE_FILE).read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(d, dict) and d.get("format") == FORMAT and d.get("finished") is False
