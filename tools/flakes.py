"""Hunt flaky tests: run the suite (or some of it) many times and tabulate every test that
failed at least once, with its failure rate.

Each run is ``pytest`` as ``make test`` runs it (two xdist workers, whole files per worker),
but without ``-x``: a run goes on past a failure, so one run can show several. Runs
alternate between the fixed order (``make test``'s longest-first) and a random file order
(``--file-order-seed``, a new seed each run) when ``--order both``; ``--burn K`` keeps K
busy-loop processes running beside the suite (a loaded machine: what CI's neighbours do).

Every run's outcome is appended to ``--log`` (JSON lines: the run's settings, its wall
time, each test's outcome), so a hunt can be stopped and continued, and ``--report`` prints
the table of a log without running anything::

    .venv/bin/python tools/flakes.py --runs 10 --order both --burn 1 --log flakes.jsonl
    .venv/bin/python tools/flakes.py --report flakes.jsonl
    .venv/bin/python tools/flakes.py --runs 30 --log one.jsonl \\
        tests/distributed/test_signals.py::test_sigkill_of_an_asp_worker_is_survived

``--tree DIR`` runs the suite of another checkout of the project (e.g. a ``git worktree``
of a fixed commit, so that edits made meanwhile in this one do not leak into the runs);
its package is put first on ``PYTHONPATH`` for the suite and every process it starts.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _burn() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:
        pass


def outcomes(junit: Path) -> tuple[dict[str, str], dict[str, float], dict[str, str]]:
    """test id -> passed / failed / error / skipped, test id -> seconds, and failed test id
    -> the start of its failure's text, from pytest's JUnit XML."""
    found: dict[str, str] = {}
    took: dict[str, float] = {}
    why: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/")
        name = f"{path}.py::{case.get('name')}"
        kinds = {child.tag for child in case}
        found[name] = ("failed" if "failure" in kinds else "error" if "error" in kinds
                       else "skipped" if "skipped" in kinds else "passed")
        took[name] = round(float(case.get("time", 0.0)), 2)
        for child in case:
            if child.tag in ("failure", "error"):
                why[name] = (child.get("message") or "")[:300] + " | " + (child.text or "")[-900:]
    return found, took, why


def run_once(tree: Path, tests: list[str], workers: int, seed: int | None, burn: int,
             timeout_s: float) -> dict:
    """One pytest run of ``tests`` (the whole suite when empty) in ``tree``."""
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(burn)]
    for b in burners:
        b.start()
    with tempfile.TemporaryDirectory(prefix="phalanx-flakes-") as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               f"--junitxml={junit}", *tests]
        if workers:
            cmd += ["-n", str(workers), "--dist", "loadfile", "--no-loadscope-reorder"]
        if seed is not None:
            cmd += ["--file-order-seed", str(seed)]
        env = dict(os.environ, PYTHONPATH=str(tree))
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True,
                                  timeout=timeout_s)
            code, tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
        except subprocess.TimeoutExpired as e:
            code, tail = -1, f"timed out after {timeout_s:g} s: {str(e.stdout)[-2000:]}"
        wall = time.monotonic() - t0
        for b in burners:
            b.terminate()
            b.join()
        tests_seen, took, why = outcomes(junit) if junit.is_file() else ({}, {}, {})
    return {"exit": code, "wall_s": round(wall, 1), "seed": seed, "burn": burn,
            "workers": workers, "outcomes": tests_seen, "seconds": took, "failures": why,
            "tail": tail if code not in (0, 5) else ""}


def table(records: list[dict]) -> str:
    """Every test that failed at least once: its runs, failures and rate."""
    runs: dict[str, int] = defaultdict(int)
    failed: dict[str, int] = defaultdict(int)
    for r in records:
        for test, result in r["outcomes"].items():
            if result == "skipped":
                continue
            runs[test] += 1
            failed[test] += result in ("failed", "error")
    lines = [f"{len(records)} runs: " + ", ".join(
        f"{'random' if r['seed'] is not None else 'fixed'} order, burn {r['burn']}, "
        f"exit {r['exit']}, {r['wall_s']:.0f} s" for r in records), "",
        "| test | runs | failures | rate |", "|---|---|---|---|"]
    flaky = sorted((t for t in failed if failed[t]), key=lambda t: -failed[t] / runs[t])
    lines += [f"| {t} | {runs[t]} | {failed[t]} | {failed[t] / runs[t]:.0%} |" for t in flaky]
    if not flaky:
        lines.append("| (none failed) | | | |")
    broken = [r for r in records if not r["outcomes"]]
    if broken:
        lines += ["", f"{len(broken)} run(s) recorded no test outcome (a crash or a timeout):"]
        lines += [r["tail"][-500:] for r in broken]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tests", nargs="*", help="test files or ids (default: the whole suite)")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--order", choices=("fixed", "random", "both"), default="both")
    ap.add_argument("--burn", type=int, default=0, help="busy-loop processes beside the suite")
    ap.add_argument("--workers", type=int, default=2, help="xdist workers (0: one process)")
    ap.add_argument("--seed", type=int, default=1, help="the first random order's seed")
    ap.add_argument("--timeout-s", type=float, default=1800.0, help="per run")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose suite runs")
    ap.add_argument("--log", type=Path, help="append each run's record here (JSON lines)")
    ap.add_argument("--report", type=Path, metavar="LOG", help="print LOG's table and exit")
    args = ap.parse_args(argv)
    if args.report is not None:
        try:
            records = [json.loads(ln) for ln in args.report.read_text().splitlines() if ln]
        except (OSError, ValueError) as e:
            print(f"flakes: --report {args.report}: {e}", file=sys.stderr)
            return 2
        print(table(records))
        return 0
    if args.runs < 1 or args.burn < 0 or args.workers < 0:
        print("flakes: --runs must be >= 1, --burn and --workers >= 0", file=sys.stderr)
        return 2
    if not (args.tree / "tests" / "conftest.py").is_file():
        print(f"flakes: --tree {args.tree}: not a phalanx checkout (no tests/conftest.py)",
              file=sys.stderr)
        return 2
    records = []
    for i in range(args.runs):
        random_order = args.order == "random" or (args.order == "both" and i % 2 == 1)
        seed = args.seed + i if random_order else None
        order = f"random order, seed {seed}" if random_order else "fixed order"
        print(f"run {i + 1}/{args.runs}: {order}, burn {args.burn}", flush=True)
        record = run_once(args.tree.resolve(), args.tests, args.workers, seed, args.burn,
                          args.timeout_s)
        bad = sorted(t for t, o in record["outcomes"].items() if o in ("failed", "error"))
        print(f"  exit {record['exit']}, {record['wall_s']:.0f} s, "
              f"{len(record['outcomes'])} tests, failed: {bad or 'none'}", flush=True)
        records.append(record)
        if args.log is not None:
            with args.log.open("a") as f:
                f.write(json.dumps(record) + "\n")
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
