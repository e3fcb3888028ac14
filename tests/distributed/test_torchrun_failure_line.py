"""A torchrun rank that fails says so at once, even with an operation of its group still in
flight (``phalanx.entry.torchrun._run_attempt``, real processes and gloo).

Destroying a gloo group waits for its operations in flight (ProcessGroupGloo joins its
worker threads). The entry destroyed the group before it printed its one line, so a rank
whose async allreduce waited on a peer printed only when that peer went away, or after
``--timeout``: once in ~20 runs of the lost-host test (tests/multinode/test_node_loss.py),
the survivors ended 30.9 s after the loss, by gloo's timeout, without the line naming the
lost node. Here rank 1 fails beside an allreduce rank 0 never joins, and rank 0 stays up
for 20 s: rank 1's line must come within seconds."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RANK = r"""
import os, sys, time
import torch, torch.distributed as dist
from phalanx.entry import torchrun
from phalanx.errors import PhalanxError

def fn(rank, world, attempt):
    if rank == 1:
        dist.all_reduce(torch.ones(4), async_op=True)  # rank 0 never joins it
        time.sleep(0.3)
        raise RuntimeError("the failure under test")
    time.sleep(20)

t0 = time.monotonic()
try:
    torchrun._run_attempt(fn, (), 0, 60.0, None)
except PhalanxError as e:
    print(f"{time.monotonic() - t0:.2f} {e}", flush=True)
    os._exit(2)
os._exit(0)
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_failing_rank_prints_its_line_at_once_beside_an_allreduce_in_flight() -> None:
    env = {**os.environ, "TORCHELASTIC_USE_AGENT_STORE": "False", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_port()), "WORLD_SIZE": "2", "PYTHONPATH": str(REPO)}
    ranks = [subprocess.Popen([sys.executable, "-c", RANK], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    try:
        out, err = ranks[1].communicate(timeout=60)
        t_end = time.monotonic()
        assert ranks[1].returncode == 2, err
        seconds, line = out.split(" ", 1)
        assert line.strip() == "rank 1 on node 0 failed: the failure under test"
        # from the start of the attempt: the group's rendezvous, 0.3 s, then the line (20 s
        # or 60 s when the group's destruction waits for the allreduce)
        assert float(seconds) < 8.0, out
        assert ranks[0].poll() is None  # rank 0 still up: nothing closed rank 1's wait
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert time.monotonic() - t_end < 5
