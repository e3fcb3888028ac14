"""Model families' figures, fitted on load from the measured data in ``../shared/data``.

* ``gavel/simulation_throughputs.json`` — throughput of 7 model families on k80/p100/v100,
  consolidated and ``_unconsolidated`` (spread), and for co-located pairs on one GPU:
  - spread penalty of a family: mean of ``(t_cons / t_uncons - 1) / (1 - 1/gang)``,
    clamped at 0 (Gavel measured several spread jobs *faster*; we do not model a gain);
  - interference sensitivity: ``1 - mean(paired / isolated)`` over all partners (v100, gang 1);
  - device speed: geometric mean over batch sizes of ``t(type) / t(v100)`` (gang 1).
* CPU sensitivity (exponent of the CPU share) is not in any data set here: it is an
  assumption per family (input-pipeline-heavy models 0.5, A3C 1.0, others 0.3).

Pollux applications borrow the interference and device numbers of the Gavel family they
resemble (``POLLUX_FAMILY``); their spread penalty is their own (``profiles.py``).
"""

from __future__ import annotations

import ast
import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from phalanx.cluster.model.profiles import load_pollux_apps
from phalanx.errors import DataError

POLLUX_FAMILY = {"bert": "Transformer", "cifar10": "ResNet-18", "deepspeech2": "LM",
                 "imagenet": "ResNet-50", "ncf": "Recommendation", "yolov3": "ResNet-50"}
CPU_SENSITIVITY = {"ResNet-18": 0.5, "ResNet-50": 0.5, "CycleGAN": 0.5, "A3C": 1.0,
                   "cifar10": 0.5, "imagenet": 0.5, "yolov3": 0.5, "deepspeech2": 0.5}


@dataclass(frozen=True)
class ModelProfile:
    """A model family's measured figures: spread penalty, speed per device type, co-
    location sensitivity, CPU sensitivity."""

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


def _gavel_key(k: str) -> tuple[str, int]:
    name, gang = ast.literal_eval(k)
    return name.split(" (")[0], int(gang)


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
