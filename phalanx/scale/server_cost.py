"""A parameter-server shard's own cost per push, measured here: phalanx's ``ShardState``
(validate + the SGD update rule, as ``bench/ps.py``'s state-only bench times it) on pushes of
several sizes, CPU seconds per push, fitted as per message + per byte. This is the
``server_msg_s`` / ``server_byte_s`` of the model (otherwise labelled assumptions)."""

from __future__ import annotations

import statistics
import time

import torch

from phalanx.comm.wire import Header, Kind
from phalanx.ps.consistency import Asynchronous
from phalanx.ps.partition import Partition
from phalanx.ps.shard import ShardState
from phalanx.rules import sgd
from phalanx.scale.calibrate import fit_line

SIZES = (4_096, 65_536, 262_144, 1_048_576)


def push_seconds(params: int, pushes: int) -> float:
    """Median CPU seconds of one push of ``params`` fp32 values into a shard."""
    part = Partition(1, (0,), ((params,),), (0, params))
    state = ShardState(0, part, torch.zeros(params), None, sgd(0.01), Asynchronous(), 1)
    grad = torch.randn(params) * 1e-3
    received = torch.empty(params)
    times = []
    for c in range(pushes):
        received.copy_(grad)  # a transport's receive buffer, outside the clock
        t0 = time.process_time()
        state.handle(0, Header(Kind.PUSH, worker=0, clock=c, seq=c, version=state.version),
                     [received])
        times.append(time.process_time() - t0)
    return statistics.median(times)


def measure_server(pushes: int = 30) -> dict[str, float]:
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # one shard, one core: as a shard process runs
    try:
        points = [(p * 4.0, push_seconds(p, pushes)) for p in SIZES]
    finally:
        torch.set_num_threads(old)
    msg, per_byte, r2 = fit_line(points)
    return {"server_msg_s": max(msg, 0.0), "server_byte_s": per_byte, "r2": r2,
            "points": [{"bytes": b, "seconds": s} for b, s in points]}
