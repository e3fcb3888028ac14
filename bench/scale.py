"""Speed of ``phalanx scale``: the analytical model over every strategy and N, and the event
simulation of the asynchronous family at 4,096 workers.

    python bench/scale.py            # full: 4,096 workers x 1,000 steps
    python bench/scale.py --quick    # 4,096 workers x 100 steps (under a minute)

Ratios (higher is better; 1.0 is exactly on target):

* ``analytical_wall``: 10 s / the time to predict the 14 strategies x N in {8, ..., 4096}
  (10 values of N) for ResNet-50 and GPT-2 (280 predictions; the issue's target: < 10 s);
* ``async_wall``: 60 s / the time of ASP with 4,096 workers x 1,000 steps against 1,024
  shards (--quick: 100 steps against 6 s, the same per-step budget);
* ``ps_flows_aggregated_vs_per_pair``: a parameter-server exchange of 512 workers with 128
  dedicated shards computed as the model does (flows summed per server pair, identical
  shards as one) against the reference in the same run, every worker-shard flow listed
  (O(N S)); both must give the same seconds.

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import emit  # noqa: E402
from phalanx.scale import collectives as C  # noqa: E402
from phalanx.scale.eventsim import AsyncSpec, simulate  # noqa: E402
from phalanx.scale.network import gbit  # noqa: E402
from phalanx.scale.sweep import SWEEP_NS, SWEEP_STRATEGIES, Shape, sweep  # noqa: E402
from phalanx.scale.workload import catalog  # noqa: E402


def time_analytical(repeats: int) -> tuple[float, int]:
    times, count = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        count = 0
        for model in ("resnet50", "gpt2"):
            rows = sweep(catalog(model), SWEEP_STRATEGIES, SWEEP_NS, Shape().network)
            count += len(rows)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), count


def time_async(steps: int) -> tuple[float, dict]:
    w = catalog("resnet50")
    spec = AsyncSpec(workers=4096, shards=1024, steps=steps, compute_s=w.step_compute_s,
                     push_bytes=w.grad_bytes, pull_bytes=w.grad_bytes,
                     # 8 GPUs share a server's 25 GbE NIC; each shard has one of its own
                     worker_bw=gbit(25) / 8, shard_bw=gbit(25), latency_s=10e-6,
                     server_msg_s=20e-6, server_byte_s=0.25e-9, consistency="asp")
    t0 = time.perf_counter()
    r = simulate(spec)
    return time.perf_counter() - t0, r.row()


def time_ps_flows() -> tuple[float, float, float, float]:
    net = Shape().network(512)
    workers, shards = list(range(512)), [net.devices + i for i in range(128)]
    big = net.with_extra(128)
    t0 = time.perf_counter()
    fast, _ = C.ps_exchange(big, workers, shards, [1 / 128] * 128, 1e8, 1e8, duplex=False)
    t_fast = time.perf_counter() - t0
    t0 = time.perf_counter()
    slow = big.phase([(w, s, 1e8 / 128) for w in workers for s in shards])
    t_slow = time.perf_counter() - t0
    return t_fast, t_slow, fast.seconds, slow.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 async steps, 1 repeat")
    args = parser.parse_args()
    steps = 100 if args.quick else 1000
    analytical_s, predictions = time_analytical(1 if args.quick else 3)
    print(f"analytical: {predictions} predictions in {analytical_s:.2f} s", file=sys.stderr)
    async_s, row = time_async(steps)
    print(f"async: 4096 workers x {steps} steps in {async_s:.1f} s: {row}", file=sys.stderr)
    t_fast, t_slow, s_fast, s_slow = time_ps_flows()
    print(f"ps flows: aggregated {t_fast * 1e3:.1f} ms, per pair {t_slow * 1e3:.1f} ms "
          f"(same time: {s_fast:.6f} vs {s_slow:.6f} s)", file=sys.stderr)
    if abs(s_fast - s_slow) > 1e-9 * s_slow:
        raise SystemExit("aggregated PS flows disagree with the per-pair reference")
    async_target = 60.0 * steps / 1000
    results = {"analytical_s": round(analytical_s, 3), "predictions": predictions,
               "async_s": round(async_s, 2), "async_steps": steps, "async_result": row,
               "ps_aggregated_ms": round(t_fast * 1e3, 2),
               "ps_per_pair_ms": round(t_slow * 1e3, 2)}
    ratios = {"analytical_wall": round(10.0 / analytical_s, 2),
              "async_wall": round(async_target / async_s, 2),
              "ps_flows_aggregated_vs_per_pair": round(t_slow / t_fast, 1)}
    emit("scale", results, ratios, {"analytical_wall": 1.0, "async_wall": 1.0,
                                    "ps_flows_aggregated_vs_per_pair": 1.0})


if __name__ == "__main__":
    main()
