"""Record, then compare, what ``phalanx simulate`` writes for a matrix of presets, policies
and workloads, so that a refactor of ``phalanx/cluster/`` can show its numbers unchanged.

    python tools/cluster_baseline.py --out /tmp/cluster_baseline [-j 2] [--only sia,gavel]
        [--workloads pollux:1] [--presets sia-artifact] [--repo /tmp/phalanx_base]
    python tools/cluster_baseline.py --compare /tmp/cluster_baseline /tmp/cluster_after

``--repo`` runs another tree's ``phalanx`` package (e.g. ``git archive COMMIT phalanx``
unpacked into a folder) with this venv, so that a baseline is recorded from the commit
before a change however the working tree has moved on since; the data folder is always
this checkout's (``--data-dir``), so both runs read the same files.

Each cell runs the real command (``phalanx simulate ... --out CELL``) and keeps its
``jobs.csv``; a cell the command refuses (e.g. ``--policy sia`` on a cluster without GPU
types) keeps its one-line error in ``error.txt`` instead, since a refusal that changes is a
change too. ``timing.json`` records each cell's wall time, so that a subset can be chosen
when the whole matrix is too slow for the machine. ``--compare`` prints, per cell, whether
the two folders' files are byte-identical, and exits non-zero when any differ.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PRESETS = ("none", "pollux-artifact", "sia-artifact")
POLICIES = ("fifo", "sjf", "las", "tiresias", "rr", "goodput", "pollux", "sia", "gavel")
# Pollux's workload 1, and Sia's Philly and Saturn workloads 1 (sim/traces.py)
WORKLOADS = ("pollux:1", "sia:philly:1", "sia:saturn:1")
KEPT = ("jobs.csv", "error.txt")


def cell_name(preset: str, policy: str, workload: str) -> str:
    return f"{preset}__{policy}__{workload.replace(':', '-')}"


REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"


def run_cell(repo: Path, out: Path, preset: str, policy: str, workload: str) -> float:
    """Run one simulation into ``out/CELL`` with ``repo``'s package; returns its wall
    seconds."""
    cell = out / cell_name(preset, policy, workload)
    cell.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-c", "import sys; from phalanx.cli import main; "
           "sys.exit(main(sys.argv[1:]))", "simulate", "--trace", workload, "--policy",
           policy, "--no-progress", "--data-dir", str(DATA), "--out", str(cell.absolute())]
    if preset != "none":
        cmd += ["--preset", preset]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=repo)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        # the refusal's last line is the message; the rest would hold timings
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        (cell / "error.txt").write_text((lines[-1] if lines else f"rc {proc.returncode}")
                                        + "\n")
    for extra in cell.iterdir():
        if extra.name not in KEPT:
            extra.unlink()
    print(f"{wall:7.1f} s  rc {proc.returncode}  {cell.name}", flush=True)
    return wall


def record(out: Path, jobs: int, only: set[str], workloads: tuple[str, ...],
           presets: tuple[str, ...], repo: Path) -> None:
    cells = [(pr, po, w) for pr in presets for po in POLICIES for w in workloads
             if not only or po in only]
    with ThreadPoolExecutor(jobs) as pool:
        walls = list(pool.map(lambda c: run_cell(repo, out, *c), cells))
    timing = {cell_name(*c): round(w, 2) for c, w in zip(cells, walls, strict=True)}
    path = out / "timing.json"
    if path.exists():   # a subset run adds to what an earlier run timed
        timing = {**json.loads(path.read_text()), **timing}
    path.write_text(json.dumps(timing, indent=1, sort_keys=True) + "\n")
    print(f"{len(cells)} cells, {sum(walls):.0f} s of runs")


def compare(a: Path, b: Path) -> int:
    """Print each cell: same, differs (which file), or only in one folder (not counted:
    a subset run); exit non-zero when any cell present in both differs."""
    cells = {d: {p.name for p in d.iterdir() if p.is_dir()} for d in (a, b)}
    differ = 0
    for name in sorted(cells[a] | cells[b]):
        if name not in cells[a] or name not in cells[b]:
            print(f"{'only in ' + (str(a) if name in cells[a] else str(b)):24s} {name}")
            continue
        files = sorted({f.name for d in (a, b) for f in (d / name).iterdir()})
        bad = [f for f in files if not ((a / name / f).is_file() and (b / name / f).is_file()
                                        and (a / name / f).read_bytes()
                                        == (b / name / f).read_bytes())]
        differ += bool(bad)
        print(f"{'DIFFERS ' + ','.join(bad) if bad else 'same':24s} {name}")
    both = len(cells[a] & cells[b])
    print(f"{differ} of {both} cells in both folders differ")
    return 1 if differ else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="folder to record the matrix into")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("DIR_A", "DIR_B"))
    p.add_argument("-j", type=int, default=1, help="cells run at once (default 1)")
    p.add_argument("--only", default="", help="comma list of policies to run (default all)")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help=f"comma list of traces (default {','.join(WORKLOADS)})")
    p.add_argument("--presets", default=",".join(PRESETS),
                   help=f"comma list of presets (default {','.join(PRESETS)})")
    p.add_argument("--repo", type=Path, default=REPO,
                   help="the tree whose phalanx package runs (default this checkout)")
    args = p.parse_args()
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        p.error("give --out DIR or --compare DIR_A DIR_B")
    unknown = set(args.presets.split(",")) - set(PRESETS)
    if unknown:
        p.error(f"--presets: unknown {', '.join(sorted(unknown))} (choose from "
                f"{', '.join(PRESETS)})")
    record(args.out, args.j, set(filter(None, args.only.split(","))),
           tuple(filter(None, args.workloads.split(","))),
           tuple(filter(None, args.presets.split(","))), args.repo.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
