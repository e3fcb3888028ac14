"""The duplex probe ``phalanx scale calibrate`` runs inside two test hosts: a gloo group of
two, timing messages one way and both ways at once as the protocols move them (each side's
receive posted before its send, as the ring does), after a pause that refills the links'
token buckets. The duplex factor is one way's time over both ways' (the bytes of one
direction per second left when both are busy); the raw-socket probe (:mod:`.probe`) gives
the link's latency, rate and bucket.

Why not the raw sockets: their two directions on one connection measured a duplex factor
of 0.74-1.00 at 100 Mbit/s from one calibration to the next, while gloo's ring and
allreduce there run both directions at the one-way rate (bench/ring_shaped.py).

    python -m phalanx.scale.gloo_probe RANK MASTER_ADDR PORT SIZES REPEATS GAP_S   (JSON)
"""

from __future__ import annotations

import json
import statistics
import sys
import time


def run(rank: int, addr: str, port: int, sizes: list[int], repeats: int, gap: float
        ) -> dict[str, list[dict]]:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                            world_size=2)
    peer, ack = 1 - rank, torch.zeros(1)
    out: dict[str, list[dict]] = {"points": [], "duplex_points": []}
    try:
        for size in sizes:
            send = torch.zeros(max(1, size // 4))
            recv = torch.empty_like(send)
            for duplex in (False, True):
                times = []
                for _ in range(repeats + 1):
                    dist.barrier()
                    time.sleep(gap)
                    t0 = time.perf_counter()
                    if duplex:
                        r = dist.irecv(recv, peer)
                        s = dist.isend(send, peer)
                        r.wait()
                        s.wait()
                    elif rank == 0:
                        dist.send(send, 1)
                    else:
                        dist.recv(recv, 0)
                    # done when the far side has it all: its one-float answer
                    if rank == 0:
                        dist.recv(ack, 1)
                    else:
                        dist.send(ack, 0)
                    times.append(time.perf_counter() - t0)
                key = "duplex_points" if duplex else "points"
                # the first message of a size warms the pair up
                out[key] += [{"bytes": send.numel() * 4, "seconds": t} for t in times[1:]]
    finally:
        dist.destroy_process_group()
    return out


def main(argv: list[str]) -> None:
    if len(argv) != 6:
        raise SystemExit(__doc__)
    rank, addr, port = int(argv[0]), argv[1], int(argv[2])
    sizes = [int(v) for v in argv[3].split(",")]
    got = run(rank, addr, port, sizes, int(argv[4]), float(argv[5]))
    if rank == 0:
        print(json.dumps(got))
        medians = {k: statistics.median(p["seconds"] for p in v) for k, v in got.items()}
        print(json.dumps(medians), file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
