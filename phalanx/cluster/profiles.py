"""Model profiles fitted from the measured data in ``../shared/data`` (see docs/cluster.md).

* ``pollux/applications/<app>/placements.csv`` — step time of 6 real jobs per placement.
  The *spread penalty* ``a`` of an application is the least-squares fit of
  ``t(placement) / t(same GPUs on one node) = 1 + a * (1 - 1/nodes)`` over every measured
  placement of 2-4 GPUs on 2-4 nodes and every per-GPU batch.
* ``gavel/simulation_throughputs.json`` — throughput of 7 model families on k80/p100/v100,
  consolidated and ``_unconsolidated`` (spread), and for co-located pairs on one GPU:
  - spread penalty of a family: mean of ``(t_cons / t_uncons - 1) / (1 - 1/gang)``,
    clamped at 0 (Gavel measured several spread jobs *faster*; we do not model a gain);
  - interference sensitivity: ``1 - mean(paired / isolated)`` over all partners (v100, gang 1);
  - device speed: geometric mean over batch sizes of ``t(type) / t(v100)`` (gang 1).
* CPU sensitivity (exponent of the CPU share) is not in any data set here: it is an
  assumption per family (input-pipeline-heavy models 0.5, A3C 1.0, others 0.3).

Pollux applications borrow the interference and device numbers of the Gavel family they
resemble (``POLLUX_FAMILY``).
"""

from __future__ import annotations

import ast
import csv
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from phalanx.errors import DataError

POLLUX_APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
POLLUX_EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80,
                 "yolov3": 50}
POLLUX_FAMILY = {"bert": "Transformer", "cifar10": "ResNet-18", "deepspeech2": "LM",
                 "imagenet": "ResNet-50", "ncf": "Recommendation", "yolov3": "ResNet-50"}
CPU_SENSITIVITY = {"ResNet-18": 0.5, "ResNet-50": 0.5, "CycleGAN": 0.5, "A3C": 1.0,
                   "cifar10": 0.5, "imagenet": 0.5, "yolov3": 0.5, "deepspeech2": 0.5}


@dataclass(frozen=True)
class ModelProfile:
    name: str
    spread_penalty: float                      # a: step-time growth when spread over nodes
    interference: float                        # sensitivity to co-located jobs (0..1)
    device_speed: tuple[tuple[str, float], ...]  # (device type, speed vs v100)
    cpu_sensitivity: float
    source: str

    def speed_on(self, device_type: str, default: float) -> float:
        for name, s in self.device_speed:
            if name == device_type:
                return s
        return default


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


class PolluxApplication:
    """Measured step times of one Pollux application, and its work per job."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.epochs = POLLUX_EPOCHS[name]
        d = root / "applications" / name
        placements: dict[str, list[tuple[float, float, float]]] = {}
        for r in _read_csv(d / "placements.csv"):
            placements.setdefault(r["placement"], []).append(
                (float(r["local_bsz"]), float(r["step_time"]), float(r["sync_time"])))
        self.placements = {k: _Curve(v) for k, v in placements.items()}
        scal: dict[tuple[int, int], list[tuple[float, float, float]]] = {}
        for r in _read_csv(d / "scalability.csv"):
            scal.setdefault((int(r["num_nodes"]), int(r["num_replicas"])), []).append(
                (float(r["local_bsz"]), float(r["step_time"]), float(r["sync_time"])))
        self.scalability = {k: _Curve(v) for k, v in scal.items()}
        bsz = [b for c in self.placements.values() for b in c.bsz]
        self.min_local_bsz, self.max_local_bsz = min(bsz), max(bsz)
        self.validation: dict[int, list[dict[str, str]]] = {}
        for f in d.glob("validation-*.csv"):
            self.validation[int(f.stem.split("-")[1])] = _read_csv(f)
        if not self.validation:
            raise DataError(f"{d}: no validation-<batch>.csv files")
        self._cache: dict[tuple[str, int], float] = {}

    def steps(self, batch_size: int) -> float:
        """Steps to train ``epochs`` epochs at this total batch: the ``iteration`` column of
        the last epoch of validation-<batch>.csv, or epochs x samples/batch when that batch
        was not validated (samples per epoch from the smallest validated batch)."""
        rows = self.validation.get(batch_size)
        if rows is not None and len(rows) >= self.epochs:
            return float(rows[self.epochs - 1]["iteration"])
        b0 = min(self.validation)
        first = self.validation[b0][0]
        samples_per_epoch = float(first["iteration"]) * b0
        return math.ceil(samples_per_epoch / batch_size) * self.epochs

    def _curve(self, counts: tuple[int, ...]) -> _Curve:
        key = min_rotation(counts)
        c = self.placements.get(key) or self.placements.get(min_rotation(sorted(counts)))
        if c is not None:
            return c
        n, r = len(counts), sum(counts)
        best = min(self.scalability, key=lambda k: (abs(k[0] - n), abs(k[1] - r)))
        return self.scalability[best]

    def step_time(self, counts: tuple[int, ...], batch_size: int) -> float:
        """Seconds per step with ``counts[i]`` GPUs on the i-th node (node order as placed).

        A per-GPU batch over the measured maximum uses gradient accumulation: the compute
        part repeats ``k`` times, the gradient sync happens once.
        """
        key = (min_rotation(counts), batch_size)
        t = self._cache.get(key)
        if t is None:
            local = batch_size / sum(counts)
            k = max(1, math.ceil(local / self.max_local_bsz - 1e-9))
            compute, sync = self._curve(counts).at(local / k)
            t = self._cache[key] = k * compute + sync
        return t

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


def _gavel_key(k: str) -> tuple[str, int]:
    name, gang = ast.literal_eval(k)
    return name.split(" (")[0], int(gang)


@functools.lru_cache(maxsize=4)
def _load_pollux(root: str) -> dict[str, PolluxApplication]:
    return {a: PolluxApplication(a, Path(root)) for a in POLLUX_APPS}


def load_pollux_apps(data_dir: Path) -> dict[str, PolluxApplication]:
    return _load_pollux(str(Path(data_dir) / "pollux"))


@functools.lru_cache(maxsize=4)
def _load_profiles(data_dir: str) -> dict[str, ModelProfile]:
    path = Path(data_dir) / "gavel" / "simulation_throughputs.json"
    try:
        gavel = json.loads(path.read_text())
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror}); set --data-dir") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: invalid JSON at line {e.lineno}") from None
    fam_speed: dict[str, dict[str, list[float]]] = {}
    fam_interf: dict[str, list[float]] = {}
    fam_spread: dict[str, list[float]] = {}
    for key, entry in gavel["v100"].items():
        fam, gang = _gavel_key(key)
        iso = entry["null"]
        if gang == 1:
            for t in ("k80", "p100"):
                other = gavel[t].get(key)
                if other and iso > 0 and other["null"] > 0:
                    fam_speed.setdefault(fam, {}).setdefault(t, []).append(other["null"] / iso)
            ratios = [v[0] / iso for k2, v in entry.items()
                      if k2 != "null" and isinstance(v, list) and v[0] > 0 and iso > 0]
            if ratios:
                fam_interf.setdefault(fam, []).append(1.0 - float(np.mean(ratios)))
        else:
            for t in ("k80", "p100", "v100"):
                cons, unc = gavel[t].get(key), gavel.get(t + "_unconsolidated", {}).get(key)
                if cons and unc and cons["null"] > 0 and unc["null"] > 0:
                    fam_spread.setdefault(fam, []).append(
                        (cons["null"] / unc["null"] - 1.0) / (1.0 - 1.0 / gang))
    families = sorted(fam_interf)

    def speeds(fam: str) -> tuple[tuple[str, float], ...]:
        out = [("v100", 1.0)]
        for t, xs in sorted(fam_speed.get(fam, {}).items()):
            out.append((t, float(np.exp(np.mean(np.log(xs))))))
        return tuple(out)

    profiles: dict[str, ModelProfile] = {}
    for fam in families:
        profiles[fam] = ModelProfile(
            fam, max(0.0, float(np.mean(fam_spread.get(fam, [0.0])))),
            float(np.clip(np.mean(fam_interf[fam]), 0.0, 1.0)), speeds(fam),
            CPU_SENSITIVITY.get(fam, 0.3), "gavel/simulation_throughputs.json")
    for app, pa in load_pollux_apps(Path(data_dir)).items():
        fam = POLLUX_FAMILY[app]
        base = profiles[fam]
        profiles[app] = ModelProfile(app, pa.spread_penalty(), base.interference,
                                     base.device_speed, CPU_SENSITIVITY.get(app, 0.3),
                                     f"pollux/applications/{app}/placements.csv + gavel {fam}")
    return profiles


def load_profiles(data_dir: Path) -> dict[str, ModelProfile]:
    """All model profiles (7 Gavel families + 6 Pollux applications), fitted on load."""
    return _load_profiles(str(Path(data_dir)))
