"""Shared helpers for benchmarks: repo on sys.path, medians, the JSON last line, ranks on
shaped test hosts."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def shaped(bench: str, points: list, run: Callable[[Any], tuple[str, dict, dict]]) -> None:
    """The shaped benches' loop and last line: ``run(point)`` gives the point's key, its
    seconds by way and its ratios (the first one's target: <= 1.05); without test hosts
    nothing runs and the results say why."""
    from phalanx.runtime.hosts import unavailable

    reason = unavailable()
    results: dict = {}
    ratios: dict = {}
    targets: dict = {}
    if reason is not None:
        results["skipped"] = f"no test hosts: {reason}"
    for point in ([] if reason else points):
        key, got, rated = run(point)
        results[key] = {k: round(v * 1e3, 1) for k, v in got.items()}  # ms
        ratios.update({f"{key} {name}": round(v, 3) for name, v in rated.items()})
        targets[f"{key} {next(iter(rated))}"] = "<= 1.05"
    print(json.dumps({"bench": bench, "results": results, "ratios": ratios,
                      "targets": targets}))


def on_test_hosts(script: str, world: int, rate: float, args: list[str], reader: int,
                  timeout_s: float = 600) -> dict:
    """Run ``script --rank R ADDR *args`` as rank R on each of ``world`` test hosts (one
    process each, links shaped to ``rate`` Mbit/s both ways) and return the JSON object
    rank ``reader`` prints last. Every process is ended before the hosts go."""
    from phalanx.runtime.hosts import TestNetwork

    name = Path(script).stem
    with TestNetwork(world) as net:
        net.shape(rate)
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(ROOT)}
        procs = [net.hosts[r].popen([sys.executable, script, "--rank", str(r),
                                     net.hosts[0].addr, *args],
                                    stdout=subprocess.PIPE, text=True, env=env)
                 for r in range(world)]
        try:
            out = procs[reader].communicate(timeout=timeout_s)[0]
            for p in procs:
                p.wait(timeout=60)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    if procs[reader].returncode != 0:
        raise SystemExit(f"{name}: rank {reader} exited with {procs[reader].returncode}")
    return json.loads(out.strip().splitlines()[-1])
