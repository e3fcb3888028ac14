"""Finds the runs and schedules under the dashboard's folder by their files, and keeps one
reader per folder so that a rescan reads only what changed.

- a schedule: ``scheduler-state.json`` (live), ``compare.json`` (one schedule per
  ``jobs-*.csv``) or ``jobs.csv`` beside a ``summary.json``;
- a run: ``events.jsonl`` or ``summary.json`` (with ``config.json``), not a schedule.

A run folder is not searched further; a schedule's is (its ``jobs/NAME`` runs). Hidden
folders, ``tensorboard`` and links are not followed."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from phalanx.dashboard.runs import LOCK, Run
from phalanx.dashboard.safe_path import rel_id
from phalanx.dashboard.schedules import STATE_FILE, Schedule

SKIP = {"tensorboard", "logs", "ranks", "__pycache__", "node_modules"}
MAX_DEPTH = 8
RESCAN_S = 3.0  # the tree is walked again at most this often (a new run shows within it;
#                a run or schedule asked for by name is looked for at once)


def locked_inodes() -> set[int] | None:
    """Inodes that hold a lock (``/proc/locks``), read without taking one; None where the
    file does not exist (then a run without a summary counts as running)."""
    try:
        text = Path("/proc/locks").read_text()
    except OSError:
        return None
    out = set()
    for line in text.splitlines():
        parts = line.split()
        for p in parts:
            if p.count(":") == 2:
                ino = p.rsplit(":", 1)[1]
                if ino.isdigit():
                    out.add(int(ino))
                break
    return out


class Folder:
    """What ``root`` holds, rescanned on demand (thread-safe)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.runs: dict[str, Run] = {}
        self.schedules: dict[str, Schedule] = {}
        self.names: dict[str, frozenset[str]] = {}  # each run folder's files
        self.lock = threading.Lock()
        self.scanned = -1e9

    def scan(self, force: bool = False) -> None:
        if not force and time.monotonic() - self.scanned < RESCAN_S:
            return
        runs: dict[str, Run] = {}
        schedules: dict[str, Schedule] = {}
        self.names = {}
        self._walk(self.root, 0, runs, schedules)
        self.runs, self.schedules = runs, schedules
        self.scanned = time.monotonic()

    def _walk(self, folder: Path, depth: int, runs: dict[str, Run],
              schedules: dict[str, Schedule]) -> None:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        names = {e.name for e in entries}
        rid = rel_id(self.root, folder)
        if STATE_FILE in names:
            schedules[rid] = self.schedules.get(rid) or Schedule(folder, rid, "live")
        elif "compare.json" in names:
            for n in sorted(names):
                if n.startswith("jobs-") and n.endswith(".csv"):
                    sid = f"{rid}#{n[5:-4]}"
                    schedules[sid] = self.schedules.get(sid) or Schedule(
                        folder, sid, "sim", csv_name=n, label=n[5:-4])
        elif "jobs.csv" in names and "summary.json" in names:
            schedules[rid] = self.schedules.get(rid) or Schedule(folder, rid, "sim")
        elif "events.jsonl" in names or "summary.json" in names:
            runs[rid] = self.runs.get(rid) or Run(folder, rid)
            self.names[rid] = frozenset(names)
            return
        if depth >= MAX_DEPTH:
            return
        for e in sorted(entries, key=lambda e: e.name):
            if e.name.startswith(".") or e.name in SKIP:
                continue
            try:
                if e.is_dir(follow_symlinks=False):
                    self._walk(Path(e.path), depth + 1, runs, schedules)
            except OSError:
                continue

    def index(self) -> dict[str, Any]:
        """Every run's row and every schedule's, after a rescan."""
        with self.lock:
            self.scan()
            locks = locked_inodes()
            rows = []
            for rid, run in self.runs.items():
                run.refresh(self.names.get(rid))
                rows.append(run.row(self._locked(run, locks)))
            scheds = [s.row() for s in self.schedules.values()]
            self._scheduled_status(rows)
        return {"root": str(self.root), "runs": rows, "schedules": scheds}

    def _scheduled_status(self, rows: list[dict[str, Any]]) -> None:
        """A live schedule's jobs (``OUT/jobs/NAME``) run as ranks that hold no run lock:
        while its schedule runs, a job the state says is running is running."""
        running: set[str] = set()
        for sid, s in self.schedules.items():
            if s.kind != "live":
                continue
            d = s.detail()
            if d["finished"]:
                continue
            base = "jobs/" if sid == "." else f"{sid}/jobs/"
            running.update(base + n for n, st in zip(d["jobs"]["name"], d["jobs"]["status"])
                           if st == "running")
        for i, row in enumerate(rows):
            if row["id"] in running and row["status"] != "finished":
                rows[i] = {**row, "status": "running"}

    def row(self, run: Run) -> dict[str, Any]:
        return run.row(self._locked(run, locked_inodes()))

    def _locked(self, run: Run, locks: set[int] | None) -> bool:
        if LOCK not in run.names:
            return False
        try:
            ino = os.stat(os.path.join(run.folder, LOCK)).st_ino
        except OSError:
            return False
        return True if locks is None else ino in locks

    def run(self, rid: str) -> Run | None:
        with self.lock:
            if rid not in self.runs:
                self.scan(force=True)
            run = self.runs.get(rid)
            if run is not None:
                run.refresh()
            return run

    def schedule(self, sid: str) -> dict[str, Any] | None:
        with self.lock:
            if sid not in self.schedules:
                self.scan(force=True)
            s = self.schedules.get(sid)
            return None if s is None else s.detail()

    def schedule_json(self, sid: str, only_jct: bool) -> str | None:
        """The schedule as the page fetches it, serialised once per change of its files
        (10,000 jobs are ~2 MB of JSON); ``only_jct``: its JCTs and summary only."""
        with self.lock:
            if sid not in self.schedules:
                self.scan(force=True)
            s = self.schedules.get(sid)
            return None if s is None else s.as_json(only_jct)

    def signature(self) -> tuple[Any, ...]:
        """Changes when any file the page shows changes (the live updates' trigger)."""
        sig: list[Any] = []
        with self.lock:
            self.scan()
            files = [os.path.join(r.folder, n) for r in self.runs.values()
                     for n in ("events.jsonl", "summary.json")]
            files += [os.path.join(s.folder, n) for s in self.schedules.values()
                      for n in (STATE_FILE, s.csv_name)]
        for f in files:
            try:
                st = os.stat(f)
                sig.append((st.st_mtime_ns, st.st_size))
            except OSError:
                sig.append(None)
        return (*sig, len(files))
