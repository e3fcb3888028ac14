"""The fan-out probe ``phalanx scale calibrate`` runs inside three test hosts: the main
node's allreduce (``comm.allreduce.MainNodeAllReduce``'s pattern: each worker sends its
tensor to rank 0 and waits for the sum; rank 0 sends the sum to each at once) back to
back, a 2 ms compute between, timing when each worker has the sum.

Two sends of a message each from one host do not share its link fairly, nor do they go
one after the other: how far the first is ahead depends on the size (measured under
CUBIC, 2026-11-30: 400 KB at 100 Mbit/s one after the other, 3.3 MB nearly shared). The
first worker to have the sum sends its next tensor while rank 0 still sends to the other,
so the main node's next gather overlaps its broadcast by that much. Per size this prints
``first / last``: the first worker's time to the sum over the last's (0.5: one after the
other, 1: shared), the median over the repeats after a first one that warms the
connections up.

    python -m phalanx.scale.fanout_probe RANK MASTER_ADDR PORT SIZES REPEATS   (JSON)
"""

from __future__ import annotations

import json
import statistics
import sys
import time

COMPUTE_S = 0.002  # between a worker's sum and its next send, as a step's compute


def run(rank: int, addr: str, port: int, sizes: list[int], repeats: int) -> list[dict]:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                            world_size=3)
    out = []
    try:
        for size in sizes:
            x = torch.zeros(max(1, size // 4))
            parts = [torch.empty_like(x) for _ in range(2)]
            dist.barrier()
            time.sleep(0.3)  # the buckets refill, as before a run's first step
            stamps = []
            for _ in range(repeats + 1):
                if rank == 0:
                    for req in [dist.irecv(p, r + 1) for r, p in enumerate(parts)]:
                        req.wait()
                    stamps.append(time.time())  # the sends start (one clock: one machine)
                    for req in [dist.isend(x, r) for r in (1, 2)]:
                        req.wait()
                else:
                    time.sleep(COMPUTE_S)
                    dist.isend(x, 0).wait()
                    dist.irecv(x, 0).wait()
                    stamps.append(time.time())  # this worker has the sum
            mine = torch.tensor(stamps, dtype=torch.float64)  # tensors: nothing unpickled
            got = [torch.empty_like(mine) for _ in range(3)]
            dist.all_gather(got, mine)
            got = [g.tolist() for g in got]
            if rank == 0:
                ratios = []
                for i in range(1, repeats + 1):  # the first warms the connections up
                    first, last = sorted(got[w][i] - got[0][i] for w in (1, 2))
                    if last > 0:
                        ratios.append(max(0.0, first) / last)
                out.append({"bytes": x.numel() * 4,
                            "first_over_last": statistics.median(ratios),
                            "ratios": ratios})
    finally:
        dist.destroy_process_group()
    return out


def main(argv: list[str]) -> None:
    if len(argv) != 5:
        raise SystemExit(__doc__)
    rank, addr, port = int(argv[0]), argv[1], int(argv[2])
    got = run(rank, addr, port, [int(v) for v in argv[3].split(",")], int(argv[4]))
    if rank == 0:
        print(json.dumps(got))


if __name__ == "__main__":
    main(sys.argv[1:])
