"""Shared helpers for benchmarks: repo on sys.path, medians, the JSON last line."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def emit(bench: str, results: dict, ratios: dict, targets: dict) -> None:
    """Print the one JSON object every benchmark ends with (its last line)."""
    met = {k: ratios.get(k, 0.0) >= v for k, v in targets.items()}
    print(json.dumps({"bench": bench, "results": results, "ratios": ratios, "targets": targets,
                      "met": met}))
