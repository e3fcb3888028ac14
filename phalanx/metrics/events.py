"""JSONL event log: one JSON object per line, appended atomically.

Several processes of one run append to the same ``events.jsonl``: each line is written
with a single ``os.write`` on an ``O_APPEND`` descriptor, so lines never interleave.

An optional TensorBoard writer mirrors the numeric fields as scalars, all processes of a
run into one TensorBoard run (``OUT/tensorboard``; each process writes its own event file
there, opened at its first scalar, so a process with nothing to plot leaves nothing).
Tags: ``eval/...`` and ``summary/...`` (one writer per run), ``rankR/KIND/...`` for the
rest (``R`` as in ``events.jsonl``). The x axis is the event's ``step`` (a shard's
``apply``: its ``version``; the summary: the run's ``steps``).
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any


class EventLog:
    def __init__(self, path: str | Path | None, rank: int = 0, role: str = "worker",
                 tensorboard_dir: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.rank, self.role = rank, role
        self._fd: int | None = None
        self._tb = None
        self._t0 = time.perf_counter()
        self._last_train: tuple[float, float] | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._tb_dir = Path(tensorboard_dir) if tensorboard_dir is not None else None

    def log(self, kind: str, **fields: Any) -> dict[str, Any]:
        record = {"kind": kind, "rank": self.rank, "role": self.role,
                  "t": round(time.perf_counter() - self._t0, 6),
                  "unix": round(time.time(), 4),  # comparable across processes
                  # a diverged run logs its NaN/inf loss as null instead of failing the log
                  **finite_or_none(fields)}
        if self._fd is not None:
            line = json.dumps(record, default=_jsonable, allow_nan=False) + "\n"
            os.write(self._fd, line.encode())
        x = fields.get("step", fields.get("version", fields.get("steps")))
        if self._tb_dir is not None and isinstance(x, (int, float)) and self._writer():
            prefix = kind if kind in ("eval", "summary") else f"rank{self.rank}/{kind}"
            for key, value in fields.items():
                if (key not in ("step", "version") and isinstance(value, (int, float))
                        and not isinstance(value, bool) and math.isfinite(value)):
                    self._tb.add_scalar(f"{prefix}/{key}", value, int(x))
            if kind == "train" and "samples" in fields and "wall_s" in fields:
                self._throughput(int(x), fields["samples"], fields["wall_s"])
        return record

    def _writer(self):
        """This process's TensorBoard writer, opened at its first scalar (None: tensorboard
        is not installed; it is optional at run time)."""
        if self._tb is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                self._tb_dir = None
                return None
            self._tb = SummaryWriter(str(self._tb_dir))
        return self._tb

    def _throughput(self, step: int, samples: float, wall_s: float) -> None:
        """``train/samples_per_s`` between consecutive train events of this process."""
        last = self._last_train
        self._last_train = (samples, wall_s)
        if last is not None and wall_s > last[1]:
            self._tb.add_scalar(f"rank{self.rank}/train/samples_per_s",
                                (samples - last[0]) / (wall_s - last[1]), step)

    def close(self) -> None:
        if self._fd is not None and self.role != "driver":
            # what this process held at most (the driver adds its own to the summary)
            self.log("memory", **peak_memory())
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def peak_memory() -> dict[str, int]:
    """This process's peak resident set (``ru_maxrss``: a forked rank's counts the pages
    it shares with its fork server too, as ``top`` does) and, where it used CUDA, the peak
    bytes torch allocated there."""
    out = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    torch = sys.modules.get("torch")  # never imported for this
    if torch is not None and torch.cuda.is_initialized():
        out["max_memory_allocated"] = int(torch.cuda.max_memory_allocated())
    return out


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


def finite_or_none(record: dict[str, Any]) -> dict[str, Any]:
    """NaN / inf (a diverged run) become None, so the JSON stays standard."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in record.items()}


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """All records of an events file (a torn last line, from a crash, is skipped)."""
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out
