"""A parameter server's BSP exchange on shaped links: 2 workers and 2 shards on four test
hosts (one process each) at 20 Mbit/s (and 100 with the full run). A round: every worker
pushes its gradient (3.2 MB, the GPT's: half to each shard), each shard answers every
worker with its half once it has both workers' pushes, every worker takes both answers.
Three ways to receive, timed back to back in one group:

* ``phalanx``: phalanx's transport as the PS runs it (a shard takes every worker's
  message at once, a worker its shards' answers at once: ``GlooTransport(concurrent=)``,
  ``recv_from``);
* ``serial``: one message after another (phalanx's transport before 2026-11-29);
* ``gloo``: every receive posted up front with plain ``torch.distributed`` (the links'
  bound for this pattern).

Ratio: phalanx / gloo time per round; target <= 1.05.

    python bench/ps_shaped.py [--quick]      # needs root (test hosts)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from _common import on_test_hosts, shaped  # the repo on sys.path; test hosts

BYTES = 3_200_000  # the GPT's gradient in the steps check
WORKERS, SHARDS = 2, 2
PORT = 29571


def _round_transport(t, rank: int, piece, concurrent: bool) -> None:
    from phalanx.comm.wire import Header, Kind

    if rank < SHARDS:
        got = [t.recv(timeout_s=120).src for _ in range(WORKERS)]
        for w in got:
            t.send(w, Header(Kind.PARAMS, worker=w - SHARDS, shard=rank), [piece])
        t.flush()
        return
    for k in range(SHARDS):
        t.send(k, Header(Kind.PUSH, worker=rank - SHARDS, shard=k), [piece])
    if concurrent:
        answers = t.recv_from(list(range(SHARDS)), timeout_s=120)
    else:
        answers = [t.recv(k, timeout_s=120) for k in range(SHARDS)]
    assert all(a.tensors[0].numel() == piece.numel() for a in answers)
    t.flush()


def _round_gloo(rank: int, piece) -> None:
    import torch
    import torch.distributed as dist

    if rank < SHARDS:
        bufs = [torch.empty_like(piece) for _ in range(WORKERS)]
        for w in [dist.irecv(b, SHARDS + i) for i, b in enumerate(bufs)]:
            w.wait()
        for w in [dist.isend(piece, SHARDS + i) for i in range(WORKERS)]:
            w.wait()
        return
    sends = [dist.isend(piece, k) for k in range(SHARDS)]
    bufs = [torch.empty_like(piece) for _ in range(SHARDS)]
    for w in [dist.irecv(b, k) for k, b in enumerate(bufs)] + sends:
        w.wait()


def _rank(rank: int, addr: str, reps: int) -> None:
    import torch
    import torch.distributed as dist

    from phalanx.comm.transport import GlooTransport
    from phalanx.comm.wire import Header, Kind

    torch.set_num_threads(1)
    world = WORKERS + SHARDS
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{PORT}", rank=rank,
                            world_size=world)
    piece = torch.zeros(BYTES // 4 // SHARDS)
    out = {}
    for name in ("phalanx", "serial", "gloo"):
        concurrent = name == "phalanx"
        times = []
        for _ in range(reps + 1):  # the first fills queues and windows
            # a fresh transport a round (as a run's), whose receive threads end with it
            t = GlooTransport(rank, world, concurrent=range(SHARDS, world)
                              if concurrent and rank < SHARDS else ())
            dist.barrier()
            t0 = time.perf_counter()
            if name == "gloo":
                _round_gloo(rank, piece)
            else:
                _round_transport(t, rank, piece, concurrent)
            times.append(time.perf_counter() - t0)
            if concurrent:  # end the shards' receive threads: a DONE from each worker
                if rank >= SHARDS:
                    for k in range(SHARDS):
                        t.send(k, Header(Kind.DONE, worker=rank - SHARDS, shard=k))
                    t.flush()
                else:
                    for _ in range(WORKERS):
                        t.recv(timeout_s=120)
        dist.barrier()
        out[name] = statistics.median(times[1:])
    if rank == SHARDS:  # a worker's view of the round
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        _rank(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 Mbit/s only, 3 rounds")
    args = parser.parse_args()

    def run(rate: float) -> tuple[str, dict, dict]:
        got = on_test_hosts(__file__, WORKERS + SHARDS, rate, [str(3 if args.quick else 6)],
                            reader=SHARDS)
        print(f"{rate:g} Mbit/s: phalanx {got['phalanx'] * 1e3:.0f} ms, one after another "
              f"{got['serial'] * 1e3:.0f} ms, gloo {got['gloo'] * 1e3:.0f} ms a round",
              file=sys.stderr)
        return f"{rate:g}mbit", got, {f"{w}/gloo time": got[w] / got["gloo"]
                                      for w in ("phalanx", "serial")}

    shaped("ps_shaped", [20.0] if args.quick else [20.0, 100.0], run)


if __name__ == "__main__":
    main()
