"""A live schedule's files for the co-location learner's tests: the scheduler's state
(placements, stops, ends) and each job's ``train`` events at given rates."""

from __future__ import annotations

import json
from pathlib import Path

UNIX0 = 1_000_000.0


def write(out: Path, jobs: dict, clock: float, rank: int = -1) -> None:
    """A state (placements/stops on the clock; unix at ``clock``) and per job train events
    every 0.5 s from ``jobs[name]["rate"]``: a list of (from, to, samples/s) on the clock;
    ``rank`` names the events' rank (-1: the job's own, as its driver writes it)."""
    out.mkdir(parents=True, exist_ok=True)
    state = {"clock": clock, "unix": UNIX0 + clock, "jobs": {
        n: {"fields": {"placements": j["placements"], "stops": j.get("stops", []),
                       "end": j.get("end", -1)}} for n, j in jobs.items()}}
    (out / "scheduler-state.json").write_text(json.dumps(state))
    for n, j in jobs.items():
        lines, samples = [], 0.0
        for a, b, rate in j["rate"]:
            t = a
            while t < b - 1e-9:
                t1 = min(b, t + 0.5)
                samples += rate * (t1 - t)
                t = t1
                lines.append(json.dumps({"kind": "train", "rank": rank, "unix": UNIX0 + t,
                                         "samples": samples}))
        d = out / "jobs" / n
        d.mkdir(parents=True)
        (d / "events.jsonl").write_text("\n".join(lines) + "\n")
