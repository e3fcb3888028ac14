"""The table over a series of chaos runs: faults by kind (injected, missed) and
violations by invariant, as Markdown (``OUT/report.md``) and JSON (``OUT/report.json``)."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

from phalanx.cluster.chaos.faults import FAULT_KINDS
from phalanx.cluster.chaos.harness import ROOT, RunResult
from phalanx.cluster.chaos.invariants import INVARIANTS


def commit() -> str:
    """The checkout's commit (with ``+dirty`` when it has changes), or ''."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=ROOT, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, cwd=ROOT, check=True,
                               timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return head + ("+dirty" if dirty else "")


def summary(results: list[RunResult]) -> dict:
    injected: Counter[str] = Counter()
    missed: Counter[str] = Counter()
    for r in results:
        for f in r.faults:
            (injected if f.outcome == "injected" else missed)[f.kind] += 1
    violations = {name: sum(len(r.violations.get(name, [])) for r in results)
                  for name in [*INVARIANTS, "the harness"]}
    return {"commit": commit(), "seeds": [r.seed for r in results],
            "injected": dict(injected), "missed": dict(missed), "violations": violations,
            "wall_s": round(sum(r.wall_s for r in results), 1),
            "lines": [f"seed {r.seed}: {name}: {line}" for r in results
                      for name, bad in r.violations.items() for line in bad]}


def markdown(s: dict) -> str:
    kinds = [k for k in FAULT_KINDS if s["injected"].get(k) or s["missed"].get(k)]
    rows = ["| fault | injected | missed (no target in time) |", "|---|---|---|"]
    rows += [f"| {k} | {s['injected'].get(k, 0)} | {s['missed'].get(k, 0)} |" for k in kinds]
    rows.append(f"| **all** | **{sum(s['injected'].values())}** | "
                f"{sum(s['missed'].values())} |")
    rows += ["", "| invariant | violations |", "|---|---|"]
    rows += [f"| {name} | {n} |" for name, n in s["violations"].items()]
    seeds = s["seeds"]
    head = (f"Chaos: seeds {seeds[0]}..{seeds[-1]} ({len(seeds)} runs), commit "
            f"{s['commit'] or 'unknown'}, {s['wall_s']:.0f} s")
    return "\n".join([head, "", *rows, *(["", "Violations:", *(f"- {x}" for x in s["lines"])]
                                          if s["lines"] else [])]) + "\n"


def write(results: list[RunResult], out: Path) -> str:
    s = summary(results)
    text = markdown(s)
    (out / "report.md").write_text(text)
    (out / "report.json").write_text(json.dumps(s, indent=1) + "\n")
    return text
