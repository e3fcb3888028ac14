"""A run's two throughput figures, from its own events (docs/events.md):

* ``samples_per_s`` — steady state: the run's training samples over the time from the
  moment every computing rank was ready (its ``ready`` event: processes started, data
  loaded, groups formed) to its last ``train`` (or L-BFGS ``lbfgs``) event. Start-up and the
  final evaluation are left out; evaluations during training stay in.
* ``startup_s`` — from the driver's ``start`` event to that moment.
* ``startup`` — the phases of the time to the first step, along the rank that logged the
  first ``train`` event (its ``ready`` event carries its start-up points, set by
  ``runtime/supervise.py``; they add up to that event's time after ``start``):

  - ``data``: the driver loading the data set, before ``start``;
  - ``spawn``: ``start`` -> the rank's first code, less the fork server's imports;
  - ``import``: the fork server's imports when this run started it (``start`` -> the end
    of its preloading; 0 when an earlier run had) plus what the rank imported itself
    (unpickling its target and arguments);
  - ``group``: joining the process group (the rendezvous waits for every rank);
  - ``setup``: the rank's own set-up after that (model, device, data placement);
  - ``first_step``: ``ready`` -> its first ``train`` event, at step ``first_step_at``.

  ``spawn``, ``import`` and ``group`` are None for a rank this code did not fork (single
  trains in the driver; torchrun starts its own processes).

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
    startup: dict[str, float | None] | None = None  # the phases (see the module)


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
    return Throughput(rate, startup, train_s, startup_phases(run))


def _since(a: float | None, b: float | None) -> float | None:
    return b - a if a is not None and b is not None else None


def startup_phases(run: Sequence[dict[str, Any]]) -> dict[str, float | None] | None:
    """The start-up phases of one attempt's events (see the module); None without a
    driver ``start``, a ``ready`` and a ``train`` event to time them by."""
    start = next((e for e in run if e.get("kind") == "start" and "unix" in e), None)
    first = min((e for e in run if e.get("kind") in STEP_KINDS and "unix" in e),
                key=lambda e: e["unix"], default=None)
    if start is None or first is None:
        return None
    ready = next((e for e in run if e.get("kind") == "ready" and "unix" in e
                  and e.get("rank") == first.get("rank")), None)
    if ready is None:
        return None
    points = [start["unix"], ready.get("forked_unix"), ready.get("imported_unix"),
              ready.get("joined_unix")]
    known = [p for p in points if p is not None]
    spawn, imported = _since(points[0], points[1]), _since(points[1], points[2])
    preloaded = _since(points[0], ready.get("preloaded_unix"))
    if spawn is not None and imported is not None and preloaded is not None:
        server = min(max(preloaded, 0.0), spawn)  # the server's imports, paid by this run
        spawn, imported = spawn - server, imported + server
    return {"data": start.get("data_s"),
            "spawn": spawn,
            "import": imported,
            "group": _since(points[2], points[3]),
            "setup": ready["unix"] - known[-1],
            "first_step": first["unix"] - ready["unix"],
            "first_step_at": first.get("step")}
