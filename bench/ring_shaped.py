"""Our ring against gloo's allreduce on shaped links: test hosts (network namespaces, one
process each) at 20 Mbit/s (and 100 with the full run), the MLP's gradient (943 KB),
allreduced back to back as training does (no pause for tbf's bucket to refill). Ratio:
ring time / gloo time per (N, rate); target <= 1.05.

Why it exists: posting a step's sends before its receives made our ring at N = 2 take
1.47x gloo's time here (581 ms against 395: gloo sends a message posted before its peer's
receive at 2/3 of a busy duplex link's rate); the ring now posts its receives first
(docs/scale.md, "Calibration and validation").

    python bench/ring_shaped.py [--quick]      # needs root (test hosts)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from _common import on_test_hosts, shaped  # the repo on sys.path; test hosts

BYTES = 943_000  # the bandwidth study's MLP gradient
PORT = 29561


def _rank(rank: int, addr: str, world: int, reps: int) -> None:
    import torch
    import torch.distributed as dist

    from phalanx.comm.allreduce import make_allreduce

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{PORT}", rank=rank,
                            world_size=world)
    x = torch.randn(BYTES // 4)
    out = {}
    for name in ("ring", "native"):
        fn = make_allreduce(name)
        dist.barrier()
        times = []
        for _ in range(reps + 2):  # back to back; the first two fill queues and windows
            t0 = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times[2:])
    if rank == 0:
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        _rank(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 2 at 20 Mbit/s only")
    args = parser.parse_args()

    def run(point: tuple[int, float]) -> tuple[str, dict, dict]:
        world, rate = point
        got = on_test_hosts(__file__, world, rate, [str(world), str(4 if args.quick else 8)],
                            reader=0, timeout_s=300)
        print(f"N={world} {rate:g} Mbit/s: ring {got['ring'] * 1e3:.0f} ms, gloo "
              f"{got['native'] * 1e3:.0f} ms", file=sys.stderr)
        return f"n{world}-{rate:g}mbit", got, {"ring/gloo time": got["ring"] / got["native"]}

    shaped("ring_shaped", [(2, 20.0)] if args.quick
           else [(2, 20.0), (3, 20.0), (2, 100.0), (3, 100.0)], run)


if __name__ == "__main__":
    main()
