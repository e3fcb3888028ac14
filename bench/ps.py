"""Parameter server benchmarks, in one run (real processes, over shared memory and gloo):

1. pushes/s one shard absorbs for a 1M-parameter model (2 pushing processes, ASP, SGD
   applied on the server) against the same messages sent over the raw transport and
   discarded (the ceiling) -> ratio ``shard_over_raw_transport``; both over
   ``--transport`` (default shm), and gloo's raw rate beside it. The receiving rank's
   time per message is split into the transport's receive and the rest of its loop
   (``per_message_ms``), and the shard's own work per push without a transport is timed
   in CPU seconds (``shard_state_only_pushes_per_s``).
2. samples/s of ASP with N = 1, 2, 4 workers (1 shard) against the single-worker loop
   (``phalanx.parallel.single``) on the same model and data -> ratios ``asp{N}_over_single``.
   Throughput is read from the runs' own "train" events (samples / wall seconds, summed
   over workers), so process start-up is not counted for either side. ``asp1_gloo``:
   the same with ``--transport gloo``, beside it.
3. the click model's sparse rows (``--model ctr``, 26 fields x 65,536 rows x 16): the
   bytes of each pull and push of a real shard and client over shm, against the formula
   (row values rows x dim x 4, 8 per row id, the dense part, a header a message) and the
   table moved whole -> ``ctr_bytes_equal_formula``, ``ctr_table_over_push`` / ``_pull``.

This machine has 2 shared cores: ASP with N workers plus a server is N + 1 processes on
them, so the N > 1 ratios measure contention as much as the protocol. Medians of repeats;
the 1-minute load average before and after is in the results (a busy machine says so).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (puts the repo on sys.path)
import torch

from phalanx.comm.shm import SHM_PREFIX, SHM_ROOT, ShmTransport
from phalanx.comm.transport import GlooTransport
from phalanx.comm.wire import HEADER_BYTES, Header, Kind
from phalanx.config import RunConfig
from phalanx.entry.api import make_job, train
from phalanx.models.ctr import table_rows
from phalanx.parallel.loop import batch_stream
from phalanx.parallel.ps import make_shard
from phalanx.ps.client import PSClient
from phalanx.ps.consistency import Asynchronous
from phalanx.ps.partition import Partition, partition, trainable
from phalanx.ps.server import Layout, serve
from phalanx.ps.shard import ShardState
from phalanx.rules import sgd
from phalanx.runtime.launch import spawn
from phalanx.runtime.memory import keep_freed_memory
from phalanx.runtime.signals import make_run_tempdir

PARAMS = 1_000_000
PUSHERS = 2


class _TimedRecv:
    """The receiving rank's transport, timing its receives: what the rest of the loop
    costs per message is the loop's wall time less this (the phases of the profile)."""

    def __init__(self, inner) -> None:
        self.inner, self.recv_s = inner, 0.0
        self.rank, self.counter = inner.rank, inner.counter

    def recv(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.inner.recv(*args, **kwargs)
        finally:
            self.recv_s += time.perf_counter() - t0

    def send(self, *args, **kwargs):
        return self.inner.send(*args, **kwargs)

    def flush(self, *args, **kwargs):
        return self.inner.flush(*args, **kwargs)


def _transport(kind: str, rank: int, world: int, shm: str | None):
    return ShmTransport(rank, world, shm) if kind == "shm" else GlooTransport(rank, world)


def _push_bench(rank: int, world: int, pushes: int, raw: bool, out: str, kind: str,
                shm: str | None) -> None:
    layout = Layout(1, PUSHERS)
    part = Partition(1, (0,), ((PARAMS,),), (0, PARAMS))
    transport = _transport(kind, rank, world, shm)
    if rank == 0:
        keep_freed_memory()  # as serve() does: the raw receiver gets the same allocator
        transport = _TimedRecv(transport)
        t0, cpu0 = time.perf_counter(), time.process_time()
        if raw:  # the ceiling: receive every message and drop it
            for _ in range(pushes * PUSHERS):
                transport.recv()
            count = pushes * PUSHERS
        else:
            state = ShardState(0, part, torch.zeros(PARAMS), None, sgd(0.01), Asynchronous(),
                               PUSHERS)
            serve(state, transport, layout, timeout_s=120)
            count = state.stats.pushes_applied
        wall = time.perf_counter() - t0
        # per message, in ms: in the transport's receive (waiting included), the rest of the
        # loop on the receiving thread, and the process's CPU (every thread: gloo's too)
        Path(out).write_text(json.dumps({
            "pushes_per_s": count / wall, "recv_ms": 1e3 * transport.recv_s / count,
            "rest_ms": 1e3 * (wall - transport.recv_s) / count,
            "cpu_ms": 1e3 * (time.process_time() - cpu0) / count}))
        return
    worker = rank - 1
    grad = torch.randn(PARAMS) * 1e-3
    if raw:
        for c in range(pushes):
            transport.send(0, Header(Kind.PUSH, worker=worker, clock=c), [grad])
        transport.flush()
        return
    client = PSClient(transport, part, layout, worker, 120)
    for c in range(pushes):
        client.push(c, grad, [0])
    client.done(pushes, torch.zeros(4, dtype=torch.float64))


def pushes_per_s(pushes: int, raw: bool, kind: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "r.json")
        shm = make_run_tempdir(SHM_PREFIX, SHM_ROOT) if kind == "shm" else None
        try:
            spawn(_push_bench, 1 + PUSHERS, (pushes, raw, out, kind, shm))
        finally:
            if shm is not None:
                shutil.rmtree(shm, ignore_errors=True)
        return json.loads(Path(out).read_text())


def state_pushes_per_s(pushes: int) -> float:
    """The shard's own work per push (validate + update rule), no transport: the ceiling
    the server loop could reach with a free network."""
    part = Partition(1, (0,), ((PARAMS,),), (0, PARAMS))
    state = ShardState(0, part, torch.zeros(PARAMS), None, sgd(0.01), Asynchronous(), 1)
    grad = torch.randn(PARAMS) * 1e-3
    received = torch.empty(PARAMS)
    spent = 0.0
    for c in range(pushes):
        # the shard takes a message's tensors over (it may update in the gradient): each
        # push gets its own copy, as a transport's receive buffer, outside the clock. CPU
        # time: on a shared machine it moves less with the load than the wall clock
        received.copy_(grad)
        t0 = time.process_time()
        state.handle(0, Header(Kind.PUSH, worker=0, clock=c, seq=c, version=state.version),
                     [received])
        spent += time.process_time() - t0
    if state.stats.pushes_applied != pushes:
        raise RuntimeError(f"state-only bench applied {state.stats.pushes_applied} of {pushes}")
    return pushes / spent


CTR = {"model": "ctr", "data": "ctr-synthetic", "ctr_rows": 65536, "ctr_dim": 16,
       "batch_size": 256, "train_limit": 20_000, "test_limit": 500, "strategy": "asp",
       "workers": 1, "servers": 1}
CTR_STEPS = 10


def _sparse_bytes(rank: int, world: int, out: str, shm: str) -> None:
    """A real shard and a worker's client over shm, the click model's batches: the bytes
    of each pull (request, answer) and push, from the transport's counters."""
    torch.set_num_threads(1)
    job = make_job(RunConfig.from_mapping(CTR).validate())
    layout = Layout(1, 1)
    transport = ShmTransport(rank, world, shm)
    if rank == 0:
        serve(make_shard(job, 0), transport, layout, timeout_s=120)
        return
    model = job.build_model()
    part = partition(model, 1)
    client = PSClient(transport, part, layout, 0, 120)
    flat = torch.zeros(part.dense_numel)
    table = trainable(model)[part.table.param].detach().clone()
    dim = part.table.dim
    c, steps = transport.counter, []
    batches = batch_stream(job.shard(0, 1), CTR["batch_size"], job.config.seed)
    for step, (_, idx) in zip(range(CTR_STEPS), batches):
        rows = table_rows(model, job.train.x[idx]).cpu()
        sent, received = c.sent, c.received
        client.pull(step, flat, rows, table)
        pull_sent, pull_received = c.sent - sent, c.received - received
        sent = c.sent
        client.push(step, torch.zeros(part.dense_numel), None, rows,
                    torch.zeros(len(rows), dim))
        steps.append({"rows": len(rows), "pull_request": pull_sent,
                      "pull_answer": pull_received, "push": c.sent - sent})
    client.done(CTR_STEPS, torch.zeros(7, dtype=torch.float64))
    Path(out).write_text(json.dumps({"dense": part.dense_numel, "dim": dim,
                                     "table_rows": part.table.rows, "steps": steps}))


def sparse_bytes() -> dict:
    """The CTR model's sparse traffic per step against the formula (rows x dim x 4 for the
    row values, 8 per row id, the dense part and one header per message) and against the
    dense table moved whole."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "r.json")
        shm = make_run_tempdir(SHM_PREFIX, SHM_ROOT)
        try:
            spawn(_sparse_bytes, 2, (out, shm))
        finally:
            shutil.rmtree(shm, ignore_errors=True)
        r = json.loads(Path(out).read_text())
    dense, dim, h = r["dense"], r["dim"], HEADER_BYTES
    exact = all(s["pull_request"] == h + 8 * s["rows"]
                and s["pull_answer"] == h + 4 * dense + s["rows"] * dim * 4
                and s["push"] == h + 4 * dense + 8 * s["rows"] + s["rows"] * dim * 4
                for s in r["steps"])
    table = r["table_rows"] * dim * 4
    rows = _common.median([s["rows"] for s in r["steps"]])
    return {"table_bytes": table, "dense_part_bytes": 4 * dense, "rows_per_step": rows,
            "push_bytes_per_step": _common.median([s["push"] for s in r["steps"]]),
            "pull_bytes_per_step": _common.median([s["pull_request"] + s["pull_answer"]
                                                   for s in r["steps"]]),
            "row_value_bytes_per_step": rows * dim * 4, "formula_exact": exact,
            "steps": r["steps"]}


def throughput(run_dir: Path) -> float:
    """Samples/s summed over workers, from each worker's last "train" event."""
    last: dict[int, dict] = {}
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e["kind"] == "train" and e.get("wall_s", 0) > 0:
            last[e["rank"]] = e
    return sum(e["samples"] / e["wall_s"] for e in last.values())


def samples_per_s(strategy: str, workers: int, steps: int, model: str, data: str,
                  pull_ahead: bool = False, transport: str = "auto") -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig(model=model, data=data, strategy=strategy, workers=workers, servers=1,
                        rule="sgd", lr=0.05, batch_size=64, max_steps=steps,
                        eval_every=10**9, progress=False, tensorboard=False, out=tmp,
                        pull_ahead=pull_ahead, transport=transport)
        train(config=cfg.validate())
        return throughput(Path(tmp))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer pushes, steps, repeats")
    ap.add_argument("--model", default="lenet5")
    ap.add_argument("--data", default="synthetic")
    ap.add_argument("--transport", default="shm", choices=("shm", "gloo"),
                    help="the transport measured (gloo's raw rate and ASP-1 are measured "
                         "beside it either way)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    # quick: 2 x 100 pushes (~0.2 s a run; 30 took ~0.1 s, within the noise of a shared
    # machine) and 3 alternated repeats, still under a minute
    pushes, steps, repeats = (100, 40, 3) if args.quick else (150, 200, 5)
    load_before = os.getloadavg()[0]
    shard, raw, raw_gloo, local = [], [], [], []
    phases: dict[str, list[dict[str, float]]] = {"raw": [], "shard": []}
    for _ in range(repeats):  # alternated: the same load for both
        for kind, rates in (("raw", raw), ("shard", shard)):
            r = pushes_per_s(pushes, kind == "raw", args.transport)
            rates.append(r.pop("pushes_per_s"))
            phases[kind].append(r)
        raw_gloo.append(pushes_per_s(pushes, True, "gloo")["pushes_per_s"])
        local.append(state_pushes_per_s(pushes))
    rates: dict[str, list[float]] = {"single": [], "asp1_pull_ahead": [], "asp1_gloo": []}
    for n in (1, 2, 4):
        rates[f"asp{n}"] = []
    for _ in range(repeats):
        rates["single"].append(samples_per_s("single", 1, steps, args.model, args.data))
        for n in (1, 2, 4):
            rates[f"asp{n}"].append(samples_per_s("asp", n, steps, args.model, args.data,
                                                  transport=args.transport))
        rates["asp1_pull_ahead"].append(samples_per_s(
            "asp", 1, steps, args.model, args.data, pull_ahead=True, transport=args.transport))
        rates["asp1_gloo"].append(samples_per_s("asp", 1, steps, args.model, args.data,
                                                transport="gloo"))
    sparse = sparse_bytes()
    med = {k: _common.median(v) for k, v in rates.items()}
    m_shard, m_raw = _common.median(shard), _common.median(raw)
    ratios = {"shard_over_raw_transport": m_shard / m_raw,
              f"raw_{args.transport}_over_raw_gloo": m_raw / _common.median(raw_gloo)}
    ratios.update({f"asp{n}_over_single": med[f"asp{n}"] / med["single"] for n in (1, 2, 4)})
    # --pull-ahead: the pull's round trip overlaps the step's compute (one push staler)
    ratios["asp1_pull_ahead_over_single"] = med["asp1_pull_ahead"] / med["single"]
    ratios["asp1_gloo_over_single"] = med["asp1_gloo"] / med["single"]
    # the click model: the table moved whole over what a step's push and pull move
    ratios["ctr_table_over_push"] = sparse["table_bytes"] / sparse["push_bytes_per_step"]
    ratios["ctr_table_over_pull"] = sparse["table_bytes"] / sparse["pull_bytes_per_step"]
    ratios["ctr_bytes_equal_formula"] = float(sparse["formula_exact"])
    _common.emit(
        "ps",
        {"load_1min_before": round(load_before, 2),
         "load_1min_after": round(os.getloadavg()[0], 2), "transport": args.transport,
         "params": PARAMS, "pushers": PUSHERS, "pushes": pushes, "steps": steps,
         "model": args.model, "data": args.data, "cores": torch.get_num_threads(),
         "shard_pushes_per_s": m_shard, "raw_transport_msgs_per_s": m_raw,
         "raw_gloo_msgs_per_s": _common.median(raw_gloo),
         "shard_state_only_pushes_per_s": _common.median(local),
         # the receiving rank's loop per message (medians, ms): in the transport's receive,
         # the rest of the loop, CPU of the whole process
         "per_message_ms": {kind: {k: round(_common.median([p[k] for p in runs]), 3)
                                   for k in runs[0]} for kind, runs in phases.items()},
         "samples_per_s": med, "ctr_sparse": sparse,
         "all": {"shard": shard, "raw": raw, "raw_gloo": raw_gloo, **rates}},
        ratios,
        # one shard should absorb 90% of what the bare transport carries (issue 36); ASP
        # with one worker should keep most of single-worker speed (a pull and a push a step)
        {"shard_over_raw_transport": 0.9, "asp1_over_single": 0.6,
         "asp1_pull_ahead_over_single": 0.6, "ctr_bytes_equal_formula": 1.0},
    )


if __name__ == "__main__":
    main()
