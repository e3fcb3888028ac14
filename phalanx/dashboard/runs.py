"""A training run's folder as the page shows it: one row of figures for the runs table and
its curves, read from ``summary.json``, ``config.json`` and ``events.jsonl``
(docs/events.md). Every read is tolerant: a missing, half-written or corrupt file becomes
a line in the row's ``problems``, never an exception.

Status: ``finished`` (a valid ``summary.json``), ``running`` (a process holds the folder's
``.phalanx.lock``: ``phalanx train`` takes it for the whole run), else ``stopped`` (it left a
checkpoint: ``phalanx train --resume`` continues it) or ``failed``."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.dashboard.jsonl_tail import JsonlTail

LOCK = ".phalanx.lock"  # phalanx.entry.paths.LOCK (the entry layer imports torch)
# summary fields the table shows, as (column, summary key)
FIGURES = (("test_loss", "test_loss"), ("test_accuracy", "test_accuracy"),
           ("perplexity", "test_perplexity"), ("samples_per_s", "samples_per_s"),
           ("tokens_per_s", "tokens_per_s"), ("startup_s", "startup_s"),
           ("bytes_per_sample", "bytes_per_sample"), ("staleness", "staleness_mean"),
           ("steps", "steps"), ("wall_s", "wall_s"), ("train_samples", "train_samples"))
DESCRIBE = ("strategy", "model", "data", "workers")


def _no_constant(name: str) -> None:
    """NaN and Infinity (Python writes them; JSON has none) are read as null."""
    return None


def read_json(path: Path) -> tuple[Any, str]:
    """(the parsed file, '') or (None, why it could not be read)."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None, ""
    except OSError as e:
        return None, f"{path.name}: cannot be read ({e.strerror})"
    try:
        return json.loads(text, parse_constant=_no_constant), ""
    except ValueError:
        what = "empty" if not text.strip() else "half-written or corrupt (not JSON)"
        return None, f"{path.name} is {what}"


def _num(v: Any) -> float | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


@dataclass
class Run:
    """One run folder, read incrementally (``refresh`` reads what changed)."""

    folder: Path
    rid: str
    tail: JsonlTail = field(init=False)
    start: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    problems_files: list[str] = field(default_factory=list)
    lead: Any = None                   # the rank whose train events make the curve
    ranks: set[Any] = field(default_factory=set)
    train: list[list[float | None]] = field(default_factory=list)  # step, samples, t, loss, acc
    evals: list[list[float | None]] = field(default_factory=list)  # step, samples, t, loss, acc
    t0: float | None = None
    stamps: dict[str, tuple[int, int]] = field(default_factory=dict)
    has_checkpoint: bool = False
    why_config: str = ""
    why_summary: str = ""
    names: frozenset[str] = frozenset()   # the folder's files at the last scan
    cached_row: tuple[Any, dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        self.tail = JsonlTail(self.folder / "events.jsonl")
        self._base = str(self.folder) + os.sep

    def _changed(self, name: str) -> bool:
        try:
            st = os.stat(self._base + name)
            stamp = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = (0, -1)
        if self.stamps.get(name) == stamp:
            return False
        self.stamps[name] = stamp
        return True

    def refresh(self, names: frozenset[str] | None = None) -> None:
        """Read what changed; ``names``: the folder's files, if the caller listed them."""
        if names is not None:
            self.names = names
        problems = []
        if self._changed("config.json"):
            cfg, why = read_json(self.folder / "config.json")
            self.config = cfg if isinstance(cfg, dict) else {}
            self.why_config = why or ("config.json is not an object" if cfg is not None
                                       and not isinstance(cfg, dict) else "")
        if self._changed("summary.json"):
            s, why = read_json(self.folder / "summary.json")
            self.summary = s if isinstance(s, dict) else None
            self.why_summary = why or ("summary.json is not an object" if s is not None
                                        and self.summary is None else "")
        problems += [w for w in (self.why_config, self.why_summary) if w]
        for ev in self.tail.read_new():
            self._add(ev)
        self.problems_files = problems
        if names is None:
            self.names = frozenset(os.listdir(self.folder)) if self.folder.is_dir() \
                else frozenset()
        self.has_checkpoint = any(n.startswith("checkpoint") for n in self.names)

    def _add(self, ev: dict[str, Any]) -> None:
        kind, unix = ev.get("kind"), _num(ev.get("unix"))
        if kind == "start":
            self.start, self.t0 = ev, unix
            return
        if self.t0 is None and unix is not None:
            self.t0 = unix
        t = None if unix is None or self.t0 is None else round(unix - self.t0, 3)
        if kind == "train":
            rank = ev.get("rank")
            self.ranks.add(rank)
            if self.lead is None:
                self.lead = rank
            if rank == self.lead:
                self.train.append([_num(ev.get("step")), _num(ev.get("samples")), t,
                                   _num(ev.get("loss")), _num(ev.get("accuracy"))])
        elif kind == "eval":
            self.evals.append([_num(ev.get("step")), _num(ev.get("samples")), t,
                               _num(ev.get("test_loss")), _num(ev.get("test_accuracy"))])

    def status(self, locked: bool) -> str:
        if self.summary is not None:
            return "finished"
        if locked:
            return "running"
        return "stopped" if self.has_checkpoint else "failed"

    def problems(self) -> list[str]:
        out = list(self.problems_files)
        if self.tail.bad:
            lines = ", ".join(map(str, self.tail.bad[:5]))
            out.append(f"events.jsonl: line(s) {lines} not JSON (corrupt)")
        if self.tail.unfinished_line:
            out.append("events.jsonl ends mid-line (still being written, or truncated)")
        if "events.jsonl" not in self.names:
            out.append("no events.jsonl")
        return out

    def row(self, locked: bool) -> dict[str, Any]:
        """The runs table's row (the last one while nothing it reads changed)."""
        key = (locked, tuple(sorted(self.stamps.items())), self.tail.offset, self.tail.lines,
               self.has_checkpoint, "events.jsonl" in self.names)
        if self.cached_row is None or self.cached_row[0] != key:
            self.cached_row = (key, self._row(locked))
        return self.cached_row[1]

    def _row(self, locked: bool) -> dict[str, Any]:
        src = {**self.config, **self.start, **(self.summary or {})}
        row: dict[str, Any] = {"id": self.rid, "status": self.status(locked)}
        for k in DESCRIBE:
            v = src.get(k)
            row[k] = v if isinstance(v, (str, int, float)) and not isinstance(v, bool) else None
        s = self.summary or {}
        for col, key in FIGURES:
            row[col] = _num(s.get(key))
        if row["steps"] is None and self.train:
            row["steps"] = self.train[-1][0]
        if s.get("worse_than_start"):
            row["note"] = "ended worse than it started"
        row["points"] = len(self.train) + len(self.evals)
        row["problems"] = self.problems()
        return row

    def curves(self, since_train: int = 0, since_eval: int = 0) -> dict[str, Any]:
        """The curve points after the first ``since_*`` (a page asks only for new ones).
        Train points are the lead rank's; samples there are that rank's times the ranks
        that log train events (exact for the synchronous strategies, docs/events.md)."""
        n = max(len(self.ranks), 1)
        train = [[p[0], None if p[1] is None else p[1] * n, *p[2:]]
                 for p in self.train[since_train:]]
        return {"train": train, "eval": self.evals[since_eval:],
                "train_total": len(self.train), "eval_total": len(self.evals)}
