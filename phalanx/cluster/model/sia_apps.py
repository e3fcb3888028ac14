"""Sia's per-type applications: each GPU type's Pollux-shaped profiles from Sia's data set
(``sia/profiles/<app>/placements-<type>.csv``), with the artifact's per-application
restart times and calibration slowdowns."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

from phalanx.cluster.model.profiles import PolluxApplication
from phalanx.errors import DataError

# The Sia artifact's (siasosp23/artifacts, sia-simulator/) per-application constants:
# checkpoint-restore seconds (``applications.py:Application.rescale_time``) and the
# calibration slowdowns (``simulator_config.SLOWDOWNS``); its applications take the per-GPU
# batch limit from each type's profile, except deepspeech2 on rtx (57).
SIA_APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
SIA_RESTART_S = {"cifar10": 50.0, "deepspeech2": 25.0, "bert": 120.0, "yolov3": 80.0,
                 "imagenet": 250.0, "ncf": 15.0}
SIA_SLOWDOWN = {"cifar10": 1.8, "imagenet": 1.2, "yolov3": 1.2, "bert": 1.2,
                "deepspeech2": 1.2, "ncf": 1.5}
SIA_MAX_LOCAL = {("deepspeech2", "rtx"): 57.0}
SIA_PROFILED_TYPES = ("aws", "azure", "dgx", "dgx-ext", "quad", "rtx")
# the type the artifact calibrates against and reads an application's facts from
SIA_REFERENCE_TYPE = "rtx"


@functools.lru_cache(maxsize=16)
def _load_sia(root: str, device_type: str) -> dict[str, PolluxApplication]:
    base = Path(root) / "profiles"
    out = {}
    for a in SIA_APPS:
        d = base / a
        if not (d / f"placements-{device_type}.csv").exists():
            raise DataError(f"{d}: no placements-{device_type}.csv (GPU type {device_type!r} "
                            f"has no profile)")
        out[a] = PolluxApplication(a, base, directory=d, suffix=device_type,
                                   max_local=SIA_MAX_LOCAL.get((a, device_type)),
                                   slowdown=SIA_SLOWDOWN[a], restart_s=SIA_RESTART_S[a])
    return out


def load_sia_apps(data_dir: Path, device_types: Sequence[str]
                  ) -> dict[str, dict[str, PolluxApplication]]:
    """Each GPU type's applications from ``sia/profiles/<app>/placements-<type>.csv`` and
    ``scalability-<type>.csv`` (Sia's data set), keyed by type then application."""
    return {t: _load_sia(str(Path(data_dir) / "sia"), t) for t in device_types}
