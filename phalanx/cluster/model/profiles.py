"""The Pollux applications' profiles, fitted from the measured data in ``../shared/data``
(see docs/cluster.md).

* ``pollux/applications/<app>/placements.csv`` — step time of 6 real jobs per placement.
  The *spread penalty* ``a`` of an application is the least-squares fit of
  ``t(placement) / t(same GPUs on one node) = 1 + a * (1 - 1/nodes)`` over every measured
  placement of 2-4 GPUs on 2-4 nodes and every per-GPU batch.

The model families measured by Gavel (and the figures the Pollux applications borrow from
them) are in ``families.py``; Sia's per-type applications in ``sia_apps.py``.
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from phalanx.errors import DataError

POLLUX_APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
POLLUX_EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80,
                 "yolov3": 50}
MAX_LOCAL_BSZ = {"yolov3": 8}   # the artifact's applications.py: max_local_bsz=8


def _read_csv(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as f:
            return list(csv.DictReader(f))
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror}); is ../shared/data present? "
                        f"(set --data-dir)") from None


def min_rotation(counts: list[int] | tuple[int, ...]) -> str:
    """Pollux writes a placement as GPUs per node in its smallest rotation (``24`` not ``42``)."""
    s = "".join(str(c) for c in counts)
    return min(s[i:] + s[:i] for i in range(len(s))) if s else s


class _Curve:
    """Compute and sync time as functions of the per-GPU batch (linear, clamped)."""

    def __init__(self, rows: list[tuple[float, float, float]]) -> None:
        rows.sort()
        self.bsz = np.array([r[0] for r in rows])
        self.compute = np.array([r[1] - r[2] for r in rows])
        self.sync = np.array([r[2] for r in rows])

    def at(self, local_bsz: float) -> tuple[float, float]:
        return (float(np.interp(local_bsz, self.bsz, self.compute)),
                float(np.interp(local_bsz, self.bsz, self.sync)))


@dataclass(frozen=True)
class BatchConfig:
    """How a total batch runs on ``replicas`` GPUs: per-GPU ``atomic`` batch, repeated
    ``1 + accum`` times (gradient accumulation) before one gradient sync."""

    atomic: int
    accum: int
    replicas: int

    @property
    def batch(self) -> int:
        """The batch actually trained (the rounding up may exceed the asked one)."""
        return self.replicas * self.atomic * (self.accum + 1)


class _Validation:
    """Per-epoch columns of one validation-<batch>.csv."""

    def __init__(self, rows: list[dict[str, str]], path: Path) -> None:
        try:
            self.progress = np.array([float(r["progress"]) for r in rows])
            self.iteration = np.array([float(r["iteration"]) for r in rows])
            self.grad_sqr = np.array([float(r["grad_sqr"]) for r in rows])
            self.grad_var = np.array([float(r["grad_var"]) for r in rows])
        except (KeyError, ValueError) as e:
            raise DataError(f"{path}: bad validation row ({e})") from None


class PolluxApplication:
    """Measured step times of one Pollux application, and its work per job.

    The rules follow the Pollux artifact's simulator (petuum/adaptdl, osdi21-artifact):
    how a total batch becomes per-GPU batch + accumulation steps (``batch_config``), the
    step time of a placement (``step_time``; placements over more than 4 nodes are
    interpolated linearly in (nodes, replicas, per-GPU batch) over all measurements), the
    statistical efficiency of a batch in each epoch (``gain``), and the work of a job
    (``work_steps``)."""

    def __init__(self, name: str, root: Path, *, directory: Path | None = None,
                 suffix: str = "", max_local: float | None = None, slowdown: float = 1.0,
                 restart_s: float | None = None) -> None:
        self.name = name
        self.epochs = POLLUX_EPOCHS[name]
        d = directory if directory is not None else root / "applications" / name
        tail = f"-{suffix}" if suffix else ""
        # a GPU type's profile (Sia's ``placements-<type>.csv``); '' = the Pollux one
        self.device_type = suffix
        # the Sia artifact's calibration: real runs were this much slower than the profile
        # (``simulator_config.SLOWDOWNS``); progress divides by it, observations do not
        self.slowdown = slowdown
        # checkpoint-restore seconds of this application (None: the engine's restart cost)
        self.restart_s = restart_s
        placements: dict[str, list[tuple[float, float, float]]] = {}
        self._points: dict[tuple[int, int, float], list[tuple[float, float]]] = {}
        for r in _read_csv(d / f"placements{tail}.csv"):
            row = (float(r["local_bsz"]), float(r["step_time"]), float(r["sync_time"]))
            placements.setdefault(r["placement"], []).append(row)
            key = (len(r["placement"]), sum(int(c) for c in r["placement"]), row[0])
            self._points.setdefault(key, []).append(row[1:])
        self.placements = {k: _Curve(v) for k, v in placements.items()}
        scal: dict[tuple[int, int], list[tuple[float, float, float]]] = {}
        self._scal_rows: list[tuple[float, ...]] = []
        for r in _read_csv(d / f"scalability{tail}.csv"):
            row = (float(r["local_bsz"]), float(r["step_time"]), float(r["sync_time"]))
            scal.setdefault((int(r["num_nodes"]), int(r["num_replicas"])), []).append(row)
            self._scal_rows.append((int(r["num_nodes"]), int(r["num_replicas"])) + row)
        self.scalability = {k: _Curve(v) for k, v in scal.items()}
        bsz = [b for c in self.placements.values() for b in c.bsz]
        # the artifact caps yolov3's per-GPU batch at 8 (memory), below its measured 16
        self.min_local_bsz = min(bsz)
        self.max_local_bsz = (max_local if max_local is not None
                              else MAX_LOCAL_BSZ.get(name, max(bsz)) if not suffix else max(bsz))
        self.validation: dict[int, list[dict[str, str]]] = {}
        for f in d.glob("validation-*.csv"):
            self.validation[int(f.stem.split("-")[1])] = _read_csv(f)
        if not self.validation:
            raise DataError(f"{d}: no validation-<batch>.csv files")
        self._val = {b: _Validation(self.validation[b], d / f"validation-{b}.csv")
                     for b in sorted(self.validation)}
        self.batches = tuple(self._val)
        self.init_batch, self.max_batch = self.batches[0], self.batches[-1]
        short = min(len(v.progress) for v in self._val.values())
        if short < self.epochs:
            raise DataError(f"{d}: validation files have {short} epochs, {name} trains "
                            f"{self.epochs}")
        # progress (iterations at the initial batch) at the end of each epoch: the
        # slowest validated run's, as the artifact reads it
        self.epoch_end = np.array([0.0] + [min(float(v.progress[e]) for v in self._val.values())
                                           for e in range(self.epochs)])
        self._interp = None
        self._cache: dict[tuple[str, int], float] = {}
        self._tput: dict[tuple[str, int], tuple[float, float]] = {}
        self._gain: dict[tuple[int, int], float] = {}
        self._limits: dict[tuple[int, ...], tuple[float, float | None]] = {}

    def measured(self) -> list[tuple[int, int, float, float, float]]:
        """Every measured point of this profile: (nodes, GPUs, per-GPU batch, step time,
        sync time) of each placement row, then each scalability row."""
        out = [(k[0], k[1], k[2], st, sy) for k, vs in self._points.items() for st, sy in vs]
        return out + [(int(r[0]), int(r[1]), r[2], r[3], r[4]) for r in self._scal_rows]

    # ------------------------------------------------------------------ batch and speed
    def batch_config(self, replicas: int, batch: int) -> BatchConfig:
        """The artifact's rule for a fixed total batch on ``replicas`` GPUs: accumulate
        when the per-GPU share exceeds the per-GPU limit; a 1-GPU job whose batch is
        larger than the initial batch always takes at least one accumulation step."""
        local = math.ceil(batch / replicas - 1e-8)
        accum = math.ceil(local / self.max_local_bsz - 1e-8) - 1
        if replicas == 1 and batch > self.init_batch:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        atomic = min(atomic, int(self.max_batch / (replicas * (accum + 1))))
        return BatchConfig(atomic, accum, replicas)

    def throughput(self, counts: tuple[int, ...], atomic: float) -> tuple[float, float]:
        """(step time, sync time) of one step at per-GPU batch ``atomic``."""
        hit = self._tput.get((counts, atomic))
        if hit is None:
            self.prefetch(counts, (atomic,))
            hit = self._tput[(counts, atomic)]
        return hit

    def prefetch(self, counts: tuple[int, ...], atomics: Sequence[float]) -> None:
        """Compute (and cache) the throughput at several per-GPU batches at once (the
        interpolation beyond 4 nodes costs one call for all of them)."""
        todo = [a for a in atomics if (counts, a) not in self._tput]
        if not todo:
            return
        curve = self.placements.get(min_rotation(counts))
        if curve is not None:
            for a in todo:
                compute, sync = curve.at(a)
                self._tput[(counts, a)] = (compute + sync, sync)
            return
        for a, out in zip(todo, self._interpolate(len(counts), sum(counts), todo)):
            self._tput[(counts, a)] = out

    def _interpolate(self, nodes: int, replicas: int, atomics: Sequence[float]
                     ) -> list[tuple[float, float]]:
        """Placements not measured (more than 4 nodes): linear interpolation over (nodes,
        replicas, per-GPU batch) of every measured point (placement means + scalability),
        nodes capped at 16; nearest measured curve outside their hull."""
        from threadpoolctl import threadpool_limits

        if self._interp is None:
            from scipy.interpolate import LinearNDInterpolator

            pts = [(k[0], k[1], k[2], float(np.mean([v[0] for v in vs])),
                    float(np.mean([v[1] for v in vs]))) for k, vs in self._points.items()]
            pts += [(n, r, b, st, sy) for n, r, b, st, sy in self._scal_rows]
            arr = np.array(pts, dtype=float)
            self._interp = LinearNDInterpolator(arr[:, :3], arr[:, 3:])
        # the first query computes every simplex's barycentric transform with LAPACK; its
        # thread pool spinning on a loaded 2-core machine took 15-30 s instead of 10 ms
        with threadpool_limits(1):
            vals = self._interp([(min(nodes, 16), replicas, a) for a in atomics])
        out = []
        for a, (st, sy) in zip(atomics, vals):
            if math.isfinite(st) and math.isfinite(sy):
                out.append((float(st), float(sy)))
                continue
            best = min(self.scalability, key=lambda k: (abs(k[0] - nodes), abs(k[1] - replicas)))
            compute, sync = self.scalability[best].at(a)
            out.append((compute + sync, sync))
        return out

    def local_limits(self, counts: tuple[int, ...]) -> tuple[float, float | None]:
        """Sia's simulator's per-GPU batch limits on a placement: the largest per-GPU
        batch profiled on it (else on scalability rows with at least its nodes and GPUs;
        ``Application.get_max_local_bsz``), and the largest profiled at its GPU count
        (``Job.update_local_bsz``'s memory correction; None when none is)."""
        hit = self._limits.get(counts)
        if hit is None:
            curve = self.placements.get(min_rotation(counts))
            n, r = len(counts), sum(counts)
            if curve is not None:
                top = float(curve.bsz.max())
            else:
                rows = [b for nn, rr, b, *_ in self._scal_rows if nn >= n and rr >= r]
                top = float(max(rows)) if rows else float(self.max_local_bsz)
            at_r = [float(c.bsz.max()) for k, c in self.placements.items()
                    if sum(int(ch) for ch in k) == r]
            hit = self._limits[counts] = (top, max(at_r) if at_r else None)
        return hit

    def sia_fixed_config(self, counts: tuple[int, ...], batch: int) -> BatchConfig:
        """A fixed total batch on this placement as Sia's simulator runs it (bsz tuning
        off: ``Job.update_local_bsz``): accumulate beyond the placement's per-GPU limit,
        on one GPU above the initial batch at least once, then the memory correction."""
        top, cap = self.local_limits(counts)
        r = sum(counts)
        local = math.ceil(batch / r - 1e-8)
        accum = math.ceil(local / top - 1e-8) - 1
        if r == 1 and batch > self.init_batch:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        if cap is not None:
            atomic = min(atomic, int(cap))
        return BatchConfig(min(atomic, int(self.max_batch / (r * (accum + 1)))), accum, r)

    def config_step_time(self, counts: tuple[int, ...], cfg: BatchConfig) -> float:
        """Seconds per (accumulated) step: the compute part repeats, the sync happens once."""
        step, sync = self.throughput(counts, cfg.atomic)
        return step + cfg.accum * (step - sync)

    def step_time(self, counts: tuple[int, ...], batch_size: int) -> float:
        """Seconds per step at total batch ``batch_size`` with ``counts[i]`` GPUs on the
        i-th node (node order as placed)."""
        key = (min_rotation(counts), batch_size)
        t = self._cache.get(key)
        if t is None:
            t = self._cache[key] = self.config_step_time(
                counts, self.batch_config(sum(counts), batch_size))
        return t

    # ------------------------------------------------------------------ statistical efficiency
    def grad_stats(self, batch: float, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) in ``epoch`` at ``batch``: linear between the validated
        batches around it (clamped to the validated range)."""
        bs = self.batches
        b = min(max(batch, bs[0]), bs[-1])
        i = int(np.searchsorted(bs, b))      # first validated batch >= b
        hi = bs[i]
        lo = hi if hi == b else bs[i - 1]
        vl, vh = self._val[lo], self._val[hi]
        if lo == hi:
            return float(vl.grad_sqr[epoch]), float(vl.grad_var[epoch])
        w = (b - lo) / (hi - lo)
        return (float((1 - w) * vl.grad_sqr[epoch] + w * vh.grad_sqr[epoch]),
                float((1 - w) * vl.grad_var[epoch] + w * vh.grad_var[epoch]))

    def gain(self, batch: int, epoch: int) -> float:
        """Progress per step at ``batch`` relative to one step at the initial batch:
        ``(var + sqr) / (var / scale + sqr)``, scale = batch / initial batch."""
        key = (batch, epoch)
        g = self._gain.get(key)
        if g is None:
            sqr, var = self.grad_stats(batch, epoch)
            scale = batch / self.init_batch
            g = self._gain[key] = (var + sqr) / (var / scale + sqr)
        return g

    def work_steps(self, replicas: int, batch_size: int) -> float:
        """Steps to train ``epochs`` epochs at this batch on ``replicas`` GPUs: the sum
        over epochs of (progress in the epoch / gain of the batch actually trained)."""
        b = self.batch_config(replicas, batch_size).batch
        return float(sum((self.epoch_end[e + 1] - self.epoch_end[e]) / self.gain(b, e)
                         for e in range(self.epochs)))

    def spread_penalty(self) -> float:
        one_node = {k: c for k, c in self.placements.items() if len(k) == 1}
        num = den = 0.0
        for key, curve in self.placements.items():
            n, g = len(key), sum(int(ch) for ch in key)
            if n < 2 or str(g) not in one_node:
                continue
            ref = one_node[str(g)]
            x = 1.0 - 1.0 / n
            for b in curve.bsz:
                t = sum(curve.at(b))
                t0 = sum(ref.at(b))
                num += x * (t / t0 - 1.0)
                den += x * x
        return max(0.0, num / den) if den else 0.0


@functools.lru_cache(maxsize=4)
def _load_pollux(root: str) -> dict[str, PolluxApplication]:
    return {a: PolluxApplication(a, Path(root)) for a in POLLUX_APPS}


def load_pollux_apps(data_dir: Path) -> dict[str, PolluxApplication]:
    return _load_pollux(str(Path(data_dir) / "pollux"))
