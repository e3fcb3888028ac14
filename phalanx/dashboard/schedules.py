"""A schedule's folder as the page shows it: a live one (``scheduler-state.json``, saved by
``phalanx schedule`` after every change) or a finished or simulated one (``summary.json`` and
``jobs.csv``; a ``--compare`` folder: ``compare.json`` and one ``jobs-<policy>-<placement>.csv``
per run, each its own schedule). Jobs are returned column by column (10,000 jobs are one
small JSON). A bad file is a line in ``problems``, never an exception."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.dashboard.cluster_map import cluster_map
from phalanx.dashboard.runs import read_json

STATE_FILE = "scheduler-state.json"      # phalanx.cluster.live.state.STATE_FILE
ARRIVALS_FILE = "dashboard-jobs.json"    # written beside a live schedule (beside.py)
STALE_S = 10.0  # an unfinished state older than this: its scheduler is not running
COLUMNS = ("name", "gpus", "status", "submit", "start", "end", "jct", "delay",
           "preemptions", "restarts", "placements", "stops", "stopped")
# stops: when each placement ended, in order (jobs.csv's ``stops`` column, the state's
# ``stops`` field; [] from files written before they recorded it). stopped: when a live job
# now waiting was stopped (its state's ``waiting_since``): its last bar ends there even
# without stops


def _f(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        return None
    try:
        x = float(v)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def parse_placements(text: str) -> list[list[Any]]:
    """``t@d,d;t@d`` -> [[t, [d, d]], [t, [d]]] (a malformed entry is skipped)."""
    out = []
    for part in text.split(";"):
        t, _, devs = part.partition("@")
        try:
            out.append([float(t), [int(d) for d in devs.split(",") if d]])
        except ValueError:
            continue
    return out


def parse_times(text: str) -> list[float]:
    """``t;t`` -> [t, t] (a malformed entry is skipped)."""
    out = []
    for part in text.split(";"):
        v = _f(part) if part else None
        if v is not None:
            out.append(v)
    return out


def _columns() -> dict[str, list[Any]]:
    return {c: [] for c in COLUMNS}


def read_jobs_csv(path: Path, problems: list[str]) -> dict[str, list[Any]]:
    cols = _columns()
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        problems.append(f"{path.name}: cannot be read ({e.strerror})")
        return cols
    rows = csv.DictReader(io.StringIO(text))
    bad = 0
    for row in rows:
        if None in row or None in row.values() or not row.get("name"):
            bad += 1
            continue
        end = _f(row.get("end"))
        status = row.get("status") or ""
        cols["name"].append(row["name"])
        cols["gpus"].append(_f(row.get("gpus")))
        cols["status"].append(status)
        cols["submit"].append(_f(row.get("submit")))
        cols["start"].append(_f(row.get("start")))
        cols["end"].append(end if end is not None and end >= 0 else None)
        cols["jct"].append(_f(row.get("jct")))
        cols["delay"].append(_f(row.get("queue_delay")))
        cols["preemptions"].append(_f(row.get("preemptions")))
        cols["restarts"].append(None)
        cols["placements"].append(parse_placements(row.get("placements") or ""))
        cols["stops"].append(parse_times(row.get("stops") or ""))
        cols["stopped"].append(None)
    if bad:
        problems.append(f"{path.name}: {bad} row(s) malformed (half-written?), skipped")
    if rows.fieldnames is None:
        problems.append(f"{path.name} is empty")
    return cols


def _state_jobs(state: dict[str, Any], arrivals: dict[str, Any]) -> dict[str, list[Any]]:
    cols = _columns()
    jobs = state.get("jobs")
    for name, job in (jobs.items() if isinstance(jobs, dict) else ()):
        if not isinstance(job, dict):
            continue
        f = job.get("fields") if isinstance(job.get("fields"), dict) else {}
        status = str(job.get("status", "?"))
        if status == "done":
            status = f"failed: {f['failure']}" if f.get("failure") else "finished"
        submit, start, end = _f(arrivals.get(name)), _f(f.get("start")), _f(f.get("end"))
        end = end if end is not None and end >= 0 else None
        start = start if start is not None and start >= 0 else None
        cols["name"].append(str(name))
        cols["gpus"].append(_f(job.get("gpus")))
        cols["status"].append(status)
        cols["submit"].append(submit)
        cols["start"].append(start)
        cols["end"].append(end)
        cols["jct"].append(None if end is None or submit is None else end - submit)
        executed = _f(f.get("executed"))
        cols["delay"].append(None if None in (end, submit, executed) else
                             end - submit - executed)  # type: ignore[operator]
        cols["preemptions"].append(_f(f.get("preemptions")))
        cols["restarts"].append(_f(f.get("restarts")))
        places = f.get("placements")
        cols["placements"].append([p for p in places if isinstance(p, list) and len(p) == 2]
                                  if isinstance(places, list) else [])
        stops = f.get("stops")
        cols["stops"].append([t for t in stops if _f(t) is not None]
                             if isinstance(stops, list) else [])
        since = _f(f.get("waiting_since"))
        cols["stopped"].append(since if status == "waiting" and cols["placements"][-1]
                               and since is not None and since >= 0 else None)
    for name in state.get("pending") or ():
        if isinstance(name, str) and name not in cols["name"]:
            cols["name"].append(name)
            for c in COLUMNS[1:]:
                cols[c].append([] if c in ("placements", "stops") else None)
            cols["status"][-1] = "not arrived"
            cols["submit"][-1] = _f(arrivals.get(name))
    return cols


@dataclass
class Schedule:
    folder: Path
    sid: str
    kind: str                     # live | sim
    csv_name: str = "jobs.csv"    # the jobs file (a --compare folder has several)
    label: str = ""
    stamp: tuple[int, ...] = (0, -1)
    cached: dict[str, Any] = field(default_factory=dict)
    texts: dict[bool, str] = field(default_factory=dict)

    def _stamp(self) -> tuple[int, ...]:
        names = (STATE_FILE, self.csv_name, "summary.json", "compare.json")
        best, state_ns = (0, 0), 0
        for n in names:
            try:
                st = os.stat(self.folder / n)
                best = (max(best[0], st.st_mtime_ns), best[1] + st.st_size)
                state_ns = st.st_mtime_ns if n == STATE_FILE else state_ns
            except OSError:
                pass
        stale = self.kind == "live" and time.time() - state_ns / 1e9 > STALE_S
        return (*best, int(stale))

    def detail(self) -> dict[str, Any]:
        stamp = self._stamp()
        if stamp != self.stamp or not self.cached:
            self.cached, self.stamp, self.texts = self._read(), stamp, {}
        return self.cached

    def as_json(self, only_jct: bool) -> str:
        d = self.detail()
        if only_jct not in self.texts:
            if only_jct:
                d = {**d, "jobs": {"name": d["jobs"]["name"], "jct": d["jobs"]["jct"]}}
            self.texts[only_jct] = json.dumps(d, separators=(",", ":"), allow_nan=False,
                                              default=str)
        return self.texts[only_jct]

    def _read(self) -> dict[str, Any]:
        problems: list[str] = []
        summary, why = read_json(self.folder / "summary.json")
        if why:
            problems.append(why)
        summary = summary if isinstance(summary, dict) else {}
        if self.csv_name != "jobs.csv":  # one run of a --compare folder
            runs, why = read_json(self.folder / "compare.json")
            if why:
                problems.append(why)
            summary = next((r for r in runs or () if isinstance(r, dict) and
                            f"jobs-{r.get('ordering')}-{r.get('placement')}.csv"
                            == self.csv_name), {})
        out: dict[str, Any] = {"id": self.sid, "kind": self.kind, "label": self.label,
                               "summary": summary, "clock": None, "finished": True,
                               "queue": [], "lost": []}
        state_servers: list[str] = []
        cols = None
        if self.kind == "live":
            state, why = read_json(self.folder / STATE_FILE)
            if why or not isinstance(state, dict) or "jobs" not in state:
                problems.append(why or f"{STATE_FILE} is not a schedule state (corrupt)")
            else:
                arrivals, _ = read_json(self.folder / ARRIVALS_FILE)
                cols = _state_jobs(state, arrivals if isinstance(arrivals, dict) else {})
                out["clock"] = _f(state.get("clock"))
                out["finished"] = bool(state.get("finished"))
                # a running scheduler saves at least every second: an old unfinished state
                # is a scheduler that died (phalanx schedule --resume continues it)
                age = time.time() - os.stat(self.folder / STATE_FILE).st_mtime
                if not out["finished"] and age > STALE_S:
                    out["finished"] = out["stale"] = True
                    problems.append(f"{STATE_FILE} last saved {age:.0f} s ago: the scheduler "
                                    "is not running (phalanx schedule --resume continues it)")
                out["queue"] = [q for q in state.get("queue") or () if isinstance(q, str)]
                # servers lost at the last save (drawn lost on the map)
                out["lost"] = [s for s in state.get("lost") or () if isinstance(s, str)]
                state_servers = [c for c in state.get("cluster") or () if isinstance(c, str)]
        if cols is None or (out["finished"] and (self.folder / self.csv_name).is_file()):
            cols = read_jobs_csv(self.folder / self.csv_name, problems) \
                if (self.folder / self.csv_name).is_file() else (cols or _columns())
        out["jobs"] = cols
        devices = [d for ps in cols["placements"] for p in ps for d in p[1]
                   if isinstance(d, int)]
        out["cluster"] = cluster_map(self.folder, str(summary.get("cluster") or ""),
                                     state_servers, max(devices, default=0), problems)
        out["problems"] = problems
        return out

    def row(self) -> dict[str, Any]:
        d = self.detail()
        s, jobs = d["summary"], d["jobs"]
        jct = [x for x in jobs["jct"] if x is not None]
        running = sum(1 for x in jobs["status"] if x == "running")
        status = "live" if not d["finished"] else "stopped" if d.get("stale") else "finished"
        return {"id": self.sid, "kind": self.kind, "label": self.label, "status": status,
                "policy": s.get("ordering"), "placement": s.get("placement"),
                "cluster": d["cluster"]["name"], "jobs": len(jobs["name"]),
                "running": running, "mean_jct_s": sum(jct) / len(jct) if jct else None,
                "problems": d["problems"]}
