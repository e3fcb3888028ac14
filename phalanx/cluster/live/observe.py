"""What the live scheduler reads from its jobs: the ``perf`` and ``noise`` events a sync
job's rank 0 writes (:mod:`phalanx.metrics.noise`), or a parameter-server job's worker 0
and, under BSP, its shards' ``noise_part`` shares (:mod:`phalanx.ps.noise_part`), read
incrementally from the job's ``events.jsonl``, and turned into the observations the
learned model takes (:class:`phalanx.cluster.model.learned.Learner`): step and sync time per
set-up (GPUs, nodes, per-GPU batch) and the gradient statistics at the current batch.
Nothing here knows a job's true speed: only what it measured while it ran.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from phalanx.metrics.noise import NoiseScale, two_batch_estimate

WINDOWS = 3      # perf windows (10 steps each) per set-up before it counts as observed


@dataclass
class EventTail:
    """Reads the lines appended to a file since the last call (a torn last line waits)."""

    path: Path
    offset: int = 0

    def new(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                if os.fstat(f.fileno()).st_size < self.offset:
                    self.offset = 0   # a new file: the run folder was cleared (started anew)
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = []
        for line in data[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out


@dataclass(frozen=True)
class Observation:
    """A set-up's measured step and sync time (medians over its windows): what the learner
    is fed."""

    gpus: int
    nodes: int
    batch: int          # per-GPU batch
    step_s: float       # median over the set-up's windows
    sync_s: float
    windows: int


@dataclass(frozen=True)
class Window:
    """One perf window of a set-up (10 steps): its index and step time."""

    key: tuple[int, int, int]   # (GPUs, nodes, per-GPU batch)
    index: int                  # 0 for the set-up's first window
    step_s: float


@dataclass
class JobObserver:
    """One job's measurements, per set-up, and its latest gradient statistics."""

    tail: EventTail
    # (device type, GPUs, nodes, per-GPU batch) -> (step, sync) of each window
    windows: dict[tuple[str, int, int, int], list[tuple[float, float]]] = field(
        default_factory=dict)
    g2: float = math.nan
    s: float = math.nan
    # a BSP parameter-server job: the shards' shares of an update, until all are in
    parts: dict[int, dict[int, dict]] = field(default_factory=dict)
    noise: NoiseScale = field(default_factory=NoiseScale)
    warm: int = 0       # perf windows still to drop: the first after every (re)start
    epoch: int = 0      # the last epoch the job reported (train, eval, checkpoint events)

    def read(self, nodes: int, slowdown: float = 1.0, device_type: str = ""
             ) -> tuple[list[Observation], list[Window]]:
        """Take in new events (the job runs on ``nodes`` nodes now); return the set-ups
        that just reached :data:`WINDOWS` windows or doubled them since (3, 6, 12, ...: the
        model is refitted on the growing evidence, as the Pollux artifact's profile keeps
        accumulating), and every new window. The first window after a rank 0 reports
        ``ready`` is the warm-up of a (re)start and is dropped. Times are kept
        divided by ``slowdown``, the share of the cores the job's ranks had
        (:mod:`phalanx.cluster.model.core_share`), so that set-ups measured beside different
        neighbours compare. On a cluster of several device types each type's set-ups
        are kept apart (``device_type``: the type the job runs on now)."""
        ready, fresh = [], []
        for e in self.tail.new():
            kind = e.get("kind")
            if isinstance(e.get("epoch"), int):
                self.epoch = e["epoch"]
            if kind == "noise":
                self.g2, self.s = float(e.get("g2") or math.nan), float(e.get("s") or math.nan)
            elif kind == "noise_part":
                self._share(e)
            elif kind == "start":
                self.parts.clear()   # a restart: shares of the stopped run never complete
            elif kind == "ready" and e.get("rank") == 0:
                self.warm = 1
            elif kind == "perf" and e.get("step_s", 0) > 0:
                if self.warm:
                    self.warm -= 1
                    continue
                key = (int(e["workers"]), nodes, int(e["batch"]))
                w = self.windows.setdefault((device_type, *key), [])
                w.append((float(e["step_s"]) / slowdown, float(e["sync_s"]) / slowdown))
                fresh.append(Window(key, len(w) - 1, w[-1][0]))
                n = len(w) // WINDOWS
                if len(w) % WINDOWS == 0 and n & (n - 1) == 0:
                    ready.append(self.summary(key, device_type))
        return ready, fresh

    def _share(self, e: dict) -> None:
        """One shard's share of an update's squared norms; with every shard's, the update
        is one two-batch estimate (averaged as sync's are)."""
        got = self.parts.setdefault(int(e["version"]), {})
        got[int(e["shard"])] = e
        if len(got) < int(e["shards"]):
            return
        del self.parts[int(e["version"])]
        g2, s = two_batch_estimate(sum(p["small"] for p in got.values()),
                                   sum(p["big"] for p in got.values()),
                                   float(e["b_small"]), float(e["b_big"]))
        self.noise.add(g2, s)
        self.g2, self.s = self.noise.g2, self.noise.s

    def summary(self, key: tuple[int, int, int], device_type: str = "") -> Observation:
        w = self.windows[(device_type, *key)]
        step = statistics.median(s for s, _ in w)
        # a sync time at or above the step time (clock noise) would break the fit
        sync = min(statistics.median(s for _, s in w), 0.9 * step)
        return Observation(key[0], key[1], key[2], step, sync, len(w))

    def latest(self, key: tuple[int, int, int], device_type: str = "") -> float | None:
        """The last measured step time at a set-up (None if not measured)."""
        w = self.windows.get((device_type, *key))
        return w[-1][0] if w else None

    def grad(self, init_batch: int) -> tuple[float, float]:
        """Pollux's (|G|^2, variance at the initial batch) from the noise estimate. Early
        or noise-dominated estimates (|G|^2 <= 0) mean large batches lose nothing: a tiny
        positive |G|^2 says so to the efficiency formula."""
        s = self.s if self.s > 0 else 1.0
        g2 = self.g2 if self.g2 > 0 else s * 1e-6
        return g2, s / init_batch
