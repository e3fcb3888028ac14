"""Allreduce bandwidth: our ring, the native collective (gloo) and the main-node baseline,
4 KB .. 64 MB, at N = 2 and 4 processes. Ratio: ring / native per size (target >= 0.8
from 1 MB up). Bandwidth is algorithm bandwidth: tensor bytes / median time per call.

    python bench/allreduce.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from phalanx.comm.allreduce import make_allreduce  # noqa: E402
from phalanx.runtime.launch import spawn  # noqa: E402

ALGORITHMS = ("ring", "native", "main")


def _worker(rank: int, world: int, sizes: list[int], reps: int, out: str) -> None:
    impls = {name: make_allreduce(name) for name in ALGORITHMS}
    results = {}
    for size in sizes:
        x = torch.randn(size // 4)
        n = reps if size >= 2**20 else reps * 4  # small sizes are noisy: more samples
        times: dict[str, list[float]] = {name: [] for name in ALGORITHMS}
        for rep in range(n + 1):
            for name in ALGORITHMS:  # interleaved, so machine noise hits all three alike
                buf = x.clone()
                dist.barrier()
                t0 = time.perf_counter()
                impls[name](buf)
                elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                # the slowest rank decides when the collective is done everywhere
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                if rep > 0:  # the first round warms up connections and buffers
                    times[name].append(float(elapsed))
        results[size] = {name: statistics.median(t) for name, t in times.items()}
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    args = parser.parse_args()
    sizes = [4 << 10, 64 << 10, 1 << 20, 16 << 20] if args.quick else [
        4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
    reps = 3 if args.quick else 7
    results, ratios, targets = {}, {}, {}
    for world in (2, 4):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "times.json"
            spawn(_worker, world, (sizes, reps, str(out)))
            times = json.loads(out.read_text())
        for size in sizes:
            t = times[str(size)]
            key = f"N{world}_{size >> 10}KB"
            results[key] = {f"{name}_MBps": round(size / t[name] / 2**20, 1) for name in t}
            results[key].update({f"{name}_ms": round(t[name] * 1e3, 3) for name in t})
            ratios[f"ring_over_native_{key}"] = round(t["native"] / t["ring"], 3)
            if size >= 1 << 20:
                targets[f"ring_over_native_{key}"] = 0.8
            print(f"N={world} {size >> 10:>6} KB  " + "  ".join(
                f"{name} {results[key][name + '_MBps']:>8} MB/s" for name in ALGORITHMS),
                file=sys.stderr)
    print(json.dumps({"bench": "allreduce", "results": results, "ratios": ratios,
                      "targets": targets}))


if __name__ == "__main__":
    main()
