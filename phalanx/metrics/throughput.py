"""A run's two throughput figures, from its own events (docs/events.md):

* ``samples_per_s`` — steady state: the run's training samples over the time from the
  moment every computing rank was ready (its ``ready`` event: processes started, data
  loaded, groups formed) to its last ``train`` (or L-BFGS ``lbfgs``) event. Start-up and the
  final evaluation are left out; evaluations during training stay in.
* ``startup_s`` — from the driver's ``start`` event to that moment.

Every event carries ``unix`` (wall-clock seconds), so times of different processes compare
(on several hosts, as well as their clocks agree).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

STEP_KINDS = ("train", "lbfgs")


@dataclass(frozen=True)
class Throughput:
    samples_per_s: float | None    # None: the run logged no ready/step events to time
    startup_s: float | None
    train_s: float | None


def latest_attempt(events: Sequence[dict[str, Any]]) -> Sequence[dict[str, Any]]:
    """The events from the last driver ``start`` on (a resumed run appends to its log)."""
    starts = [i for i, e in enumerate(events) if e.get("kind") == "start"]
    return events[starts[-1]:] if starts else events


def measure(events: Sequence[dict[str, Any]], train_samples: float) -> Throughput:
    run = latest_attempt(events)
    start = next((e["unix"] for e in run if e.get("kind") == "start" and "unix" in e), None)
    ready = [e["unix"] for e in run if e.get("kind") == "ready" and "unix" in e]
    steps = [e["unix"] for e in run if e.get("kind") in STEP_KINDS and "unix" in e]
    if not ready or not steps:
        return Throughput(None, None, None)
    began, ended = max(ready), max(steps)
    train_s = ended - began
    rate = train_samples / train_s if train_s > 0 else None
    startup = began - start if start is not None else None
    return Throughput(rate, startup, train_s)
