"""A parameter server's asynchronous exchange on shaped links: 3 workers and 2 shards on
five test hosts (one process each) at 20 Mbit/s (and 100 with the full run), no compute.
Each worker pushes the MLP's gradient (400 KB: half to each shard) and takes both shards'
answers, again and again; a shard answers each push as it comes (ASP). Time per worker
step, five ways timed in turn in one group:

* ``phalanx``: phalanx's transport as the PS runs it (each message one frame, header and
  payload, into a receive posted before it was sent; a receive thread per worker at the
  shard);
* ``header``: plain ``torch.distributed`` sending a header, then the payload whose receive
  is posted once the header is in (phalanx's protocol until 2026-11-29, without its
  threads and queues);
* ``header, shard ahead`` / ``header, both ahead``: the same, the payload's receive posted
  with its header at the shard / at the shard and the worker (a fix that knows the size);
* ``gloo``: plain ``torch.distributed`` with every payload's receive posted before it is
  sent (the links' bound for this pattern; what ``phalanx scale`` predicts).

Ratio: phalanx / gloo time per step; target <= 1.05. With a header before each payload it
was missed (1.03-1.31: gloo sends a message only once its receive is posted, so a payload
whose receive waits on its header pays a round trip more, and on a busy shard's links that
round trip queues behind the other workers' transfers); with frames, four ``--quick`` runs
on 2026-11-29: 0.97-1.04 (docs/scale.md "ASP at N = 3").

    python bench/ps_async_shaped.py [--quick]      # needs root (test hosts)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

from _common import on_test_hosts, shaped  # the repo on sys.path; test hosts

BYTES = 400_000  # the MLP's gradient in the steps check (`--data synthetic`)
WORKERS, SHARDS = 3, 2
HEADER = 16  # int64s
PORT = 29583
# way -> (a header before each payload, the sides that post a payload's receive with its
# header rather than once the header is in)
MODES = {"phalanx": None, "header": (True, ()), "header, shard ahead": (True, ("shard",)),
         "header, both ahead": (True, ("shard", "worker")), "gloo": (False, ())}


def _phalanx(t, rank: int, piece, steps: int) -> None:
    from phalanx.comm.wire import Header, Kind

    if rank < SHARDS:
        done = 0
        while done < WORKERS:
            m = t.recv(timeout_s=120)
            if m.header.kind == Kind.DONE:
                done += 1
            else:
                t.send(m.src, Header(Kind.PARAMS, worker=m.src - SHARDS, shard=rank), [piece])
        t.flush()
        return
    for _ in range(steps):
        for k in range(SHARDS):
            t.send(k, Header(Kind.PUSH, worker=rank - SHARDS, shard=k), [piece])
        answers = t.recv_from(list(range(SHARDS)), timeout_s=120)
        assert all(a.tensors[0].numel() == piece.numel() for a in answers)
    for k in range(SHARDS):
        t.send(k, Header(Kind.DONE, worker=rank - SHARDS, shard=k))
    t.flush()


def _plain(rank: int, piece, steps: int, header: bool, ahead: tuple[str, ...]) -> None:
    """Plain gloo; ``header``: a small message before each payload, whose receive is
    posted once that header is in, or with it on the sides in ``ahead`` (its size known)."""
    import torch
    import torch.distributed as dist

    if rank < SHARDS:
        def serve(w: int) -> None:
            buf, h = torch.empty_like(piece), torch.zeros(HEADER, dtype=torch.int64)
            for _ in range(steps):
                if header and "shard" in ahead:
                    for r in [dist.irecv(h, w, tag=1), dist.irecv(buf, w, tag=2)]:
                        r.wait()
                else:
                    if header:
                        dist.irecv(h, w, tag=1).wait()
                    dist.irecv(buf, w, tag=2).wait()
                sends = ([dist.isend(h, w, tag=1)] if header else []) + [
                    dist.isend(piece, w, tag=2)]
                for s in sends:
                    s.wait()

        threads = [threading.Thread(target=serve, args=(w,))
                   for w in range(SHARDS, SHARDS + WORKERS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return
    h = torch.zeros(HEADER, dtype=torch.int64)
    bufs = [torch.empty_like(piece) for _ in range(SHARDS)]
    heads = [torch.zeros(HEADER, dtype=torch.int64) for _ in range(SHARDS)]
    for _ in range(steps):
        reqs = []
        for k in range(SHARDS):
            reqs += ([dist.isend(h, k, tag=1)] if header else []) + [
                dist.isend(piece, k, tag=2)]
        if header and "worker" in ahead:
            reqs += [dist.irecv(heads[k], k, tag=1) for k in range(SHARDS)]
            reqs += [dist.irecv(bufs[k], k, tag=2) for k in range(SHARDS)]
        elif header:
            posted = [dist.irecv(heads[k], k, tag=1) for k in range(SHARDS)]
            for k in range(SHARDS):
                posted[k].wait()
                reqs.append(dist.irecv(bufs[k], k, tag=2))
        else:
            reqs += [dist.irecv(bufs[k], k, tag=2) for k in range(SHARDS)]
        for r in reqs:
            r.wait()


def _rank(rank: int, addr: str, steps: int, rounds: int) -> None:
    import torch
    import torch.distributed as dist

    from phalanx.comm.transport import GlooTransport

    torch.set_num_threads(1)
    world = WORKERS + SHARDS
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{PORT}", rank=rank,
                            world_size=world)
    piece = torch.zeros(BYTES // 4 // SHARDS)
    out: dict[str, list[float]] = {}
    for name in list(MODES) * rounds:  # interleaved: the machine's drift hits every way alike
        dist.barrier()
        t0 = time.perf_counter()
        if name == "phalanx":
            t = GlooTransport(rank, world, concurrent=range(SHARDS, world)
                              if rank < SHARDS else ())
            _phalanx(t, rank, piece, steps)
        else:
            _plain(rank, piece, steps, *MODES[name])
        out.setdefault(name, []).append((time.perf_counter() - t0) / steps)
    dist.barrier()
    if rank == SHARDS:  # a worker's view
        print(json.dumps({k: statistics.median(v) for k, v in out.items()}), flush=True)
    dist.destroy_process_group()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        _rank(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="20 Mbit/s only, 12 steps x 2 rounds of each way")
    args = parser.parse_args()
    steps, rounds = (12, 2) if args.quick else (20, 3)

    def run(rate: float) -> tuple[str, dict, dict]:
        got = on_test_hosts(__file__, WORKERS + SHARDS, rate, [str(steps), str(rounds)],
                            reader=SHARDS)
        print(f"{rate:g} Mbit/s, {WORKERS} workers x {SHARDS} shards: phalanx "
              f"{got['phalanx'] * 1e3:.0f} ms, header then payload {got['header'] * 1e3:.0f}"
              f" ms, gloo {got['gloo'] * 1e3:.0f} ms a step", file=sys.stderr)
        ways = ("phalanx", "header", "header, shard ahead", "header, both ahead")
        return f"{rate:g}mbit", got, {f"{w}/gloo time": got[w] / got["gloo"] for w in ways}

    shaped("ps_async_shaped", [20.0] if args.quick else [20.0, 100.0], run)


if __name__ == "__main__":
    main()
