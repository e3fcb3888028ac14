"""What a finished chaos run left, as the invariants read it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.cluster.chaos.faults import Fault
from phalanx.cluster.chaos.jobs import ChaosJob
from phalanx.cluster.chaos.watch import Seen
from phalanx.cluster.live.state import STATE_FILE


@dataclass
class RunView:
    """What a finished chaos run left: its schedule folder, the jobs, the faults' log,
    what the watch saw, the references' folders, the scheduler's output, the run's
    private temp folder, the ``/dev/shm`` entries there before it and (Ray) what was left on
the test hosts."""

    out: Path
    jobs: list[ChaosJob]
    faults: list[Fault]
    seen: Seen
    references: dict[str, Path] = field(default_factory=dict)   # kind -> its job folder
    stdout: str = ""
    tmpdir: Path | None = None
    shm_before: frozenset[str] = frozenset()
    left_on_hosts: list[str] = field(default_factory=list)     # Ray: actors left

    def state(self) -> dict[str, Any]:
        return json.loads((self.out / STATE_FILE).read_text())

    def events(self, job: str) -> list[dict[str, Any]]:
        try:
            lines = (self.out / "jobs" / job / "events.jsonl").read_text().splitlines()
        except OSError:
            return []
        return [json.loads(ln) for ln in lines if ln.endswith("}")]

    def log(self, job: str) -> str:
        try:
            return (self.out / "logs" / f"{job}.log").read_text(errors="replace")
        except OSError:
            return ""
