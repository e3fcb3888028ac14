"""Our parameter server against the ones a user would build instead, in one run.

The same model, data, batch (64), rule (SGD, lr 0.05) and step count per worker, with
N = 1, 2, 4 workers and one server, on this machine:

* **phalanx**: ``--strategy asp --servers 1`` (the default transport: shared memory on
  one host). Samples/s from the workers' own "train" events, as ``bench/ps.py`` reads them.
* **ray**: the Ray documentation's parameter server (``doc/source/ray-core/examples/
  plot_parameter_server``): a ``ParameterServer`` actor with ``apply_gradients`` (which
  returns the new weights) and ``get_weights``, ``DataWorker`` actors with
  ``compute_gradients(weights)``, and the driver's asynchronous loop (``ray.wait`` for the
  first gradient, apply it, hand that worker the weights it got back). Written as the
  docs write it: weights as a state dict, gradients as NumPy arrays.
* **rpc**: PyTorch's RPC parameter-server tutorial (``pytorch/examples`` ``distributed/rpc/
  parameter_server/rpc_parameter_server.py``): the model lives on the server, a
  ``TrainerNet``'s forward is a ``remote_method`` call of the server's forward, the
  backward is ``dist_autograd.backward``, the tutorial's check of the server's gradients
  (``get_dist_gradients``) and a ``DistributedOptimizer`` step, per batch.

Samples/s is measured over each system's training loop only (start-up of processes,
actors and RPC agents excluded, as the phalanx figure excludes it). The *round trip* is
one push of a gradient, the server's SGD step and the weights back, with no compute, N
workers at once: phalanx's ``PSClient.push`` + ``pull``; Ray's ``ray.get(ps.apply_gradients
.remote(grads))`` (the docs' server answers a push with the weights); for RPC an
``rpc_sync`` to the server's ``update_and_fetch_model`` as PyTorch's batch-RPC
parameter-server tutorial writes it (the first tutorial moves no weights at all: its model
never leaves the server). Ratios: phalanx over each peer at each N, ours measured
just after the RPC peer's run and just before Ray's (a shared machine's load drifts), and
over the faster peer (the smaller of the two ratios); ``samples_per_s`` of phalanx is the
median of those runs.

The machine has 2 shared cores; N workers + a server (+ Ray's own daemons) share them.
Ray's actors are made once (a server and 4 workers; N = 1, 2 use the first N), as each is
a process importing torch; the RPC ranks are forked from this process for the same reason.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (puts the repo on sys.path)
import numpy as np
import torch
import torch.multiprocessing as mp

from phalanx.comm.shm import SHM_PREFIX, SHM_ROOT, ShmTransport
from phalanx.config import RunConfig
from phalanx.entry.api import make_job, train
from phalanx.ps.client import PSClient
from phalanx.ps.consistency import Asynchronous
from phalanx.ps.partition import flat_dense, partition, trainable
from phalanx.ps.server import Layout, serve
from phalanx.ps.shard import ShardState
from phalanx.rules import sgd
from phalanx.runtime.launch import spawn
from phalanx.runtime.signals import make_run_tempdir

BATCH, LR = 64, 0.05


def config(args, workers: int, out: str = "") -> RunConfig:
    return RunConfig(model=args.model, data=args.data, strategy="asp", workers=workers,
                     servers=1, rule="sgd", lr=LR, batch_size=BATCH, max_steps=args.steps,
                     eval_every=10**9, progress=False, tensorboard=False,
                     out=out or tempfile.gettempdir()).validate()


def batches(job, worker: int, workers: int):
    """Worker ``worker``'s batches (its shard of the data, reshuffled every pass)."""
    shard, epoch = job.shard(worker, workers), 0
    while True:
        g = torch.Generator().manual_seed(epoch)
        order = shard[torch.randperm(len(shard), generator=g)]
        for i in range(0, len(order) - BATCH + 1, BATCH):
            idx = order[i : i + BATCH]
            yield job.train.x[idx], job.train.y[idx]
        epoch += 1


def loss_of(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(output, target)


# ---- phalanx ---------------------------------------------------------------------------


def phalanx_samples_per_s(args, workers: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        train(config=config(args, workers, tmp))
        last: dict[int, dict] = {}
        for line in (Path(tmp) / "events.jsonl").read_text().splitlines():
            e = json.loads(line)
            if e["kind"] == "train" and e.get("wall_s", 0) > 0:
                last[e["rank"]] = e
        return sum(e["samples"] / e["wall_s"] for e in last.values())


def _phalanx_round_trips(rank: int, world: int, args, shm: str, out: str) -> None:
    torch.set_num_threads(1)
    job = make_job(config(args, world - 1))
    model = job.build_model()
    part = partition(model, 1)
    layout = Layout(1, world - 1)
    transport = ShmTransport(rank, world, shm)
    if rank == 0:
        state = ShardState(0, part, flat_dense(part, trainable(model)).clone(), None, sgd(LR),
                           Asynchronous(), world - 1)
        serve(state, transport, layout, timeout_s=120)
        return
    client = PSClient(transport, part, layout, rank - 1, 120)
    flat = torch.zeros(part.dense_numel)
    grad = torch.randn(part.dense_numel) * 1e-3
    client.pull(0, flat)
    t0 = time.perf_counter()
    for c in range(args.round_trips):
        client.push(c, grad)
        client.pull(c + 1, flat)
    Path(out, f"{rank}").write_text(str((time.perf_counter() - t0) / args.round_trips))
    client.done(args.round_trips, torch.zeros(7, dtype=torch.float64))


def phalanx_round_trip_s(args, workers: int) -> float:
    shm = make_run_tempdir(SHM_PREFIX, SHM_ROOT)
    try:
        with tempfile.TemporaryDirectory() as out:
            spawn(_phalanx_round_trips, workers + 1, (args, shm, out))
            return statistics.mean(float(p.read_text()) for p in Path(out).iterdir())
    finally:
        shutil.rmtree(shm, ignore_errors=True)


# ---- Ray: the docs' ParameterServer / DataWorker actors ------------------------------


def get_weights(model):
    return {k: v.cpu() for k, v in model.state_dict().items()}


def set_weights(model, weights):
    model.load_state_dict(weights)


def get_gradients(model):
    grads = []
    for p in model.parameters():
        grad = None if p.grad is None else p.grad.data.cpu().numpy()
        grads.append(grad)
    return grads


def set_gradients(model, gradients):
    for g, p in zip(gradients, model.parameters()):
        if g is not None:
            p.grad = torch.from_numpy(g)


def ray_peer(args, counts: list[int], beside) -> dict[int, dict[str, float]]:
    """The Ray peer at each N; ``beside(n)`` runs just before each (ours, measured next to
    it in time: a shared machine's load drifts)."""
    import ray

    # an actor takes a CPU to be placed (Ray's default, kept): enough slots for the server
    # and every worker, as on the docs' many-core machine; the processes share the cores
    ray.init(num_cpus=max(os.cpu_count() or 1, 1 + max(counts)), include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    try:
        @ray.remote
        class ParameterServer:
            def __init__(self, lr, workers):
                torch.set_num_threads(1)
                self.model = make_job(config(args, workers)).build_model()
                self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr)

            def apply_gradients(self, *gradients):
                summed_gradients = [
                    np.stack(gradient_zip).sum(axis=0) for gradient_zip in zip(*gradients)
                ]
                self.optimizer.zero_grad()
                set_gradients(self.model, summed_gradients)
                self.optimizer.step()
                return get_weights(self.model)

            def get_weights(self):
                return get_weights(self.model)

        @ray.remote
        class DataWorker:
            def __init__(self, worker, workers):
                torch.set_num_threads(1)
                self.job = make_job(config(args, workers))
                self.model = self.job.build_model()
                self.data_iterator = batches(self.job, worker, workers)

            def compute_gradients(self, weights):
                set_weights(self.model, weights)
                data, target = next(self.data_iterator)
                self.model.zero_grad()
                output = self.model(data)
                loss = loss_of(output, target)
                loss.backward()
                return get_gradients(self.model)

            def round_trips(self, ps, n):
                """Push+pull with no compute: the server's answer to a push is the weights."""
                grads = [p.detach().numpy() * 0 for p in self.model.parameters()]
                t0 = time.perf_counter()
                for _ in range(n):
                    set_weights(self.model, ray.get(ps.apply_gradients.remote(grads)))
                return (time.perf_counter() - t0) / n

        # one server and max(counts) workers for the whole run (each actor is a process
        # that imports torch: made once, so --quick stays under a minute); N = 1, 2 use
        # the first N workers, each on its quarter of the data
        out = {}
        size = max(counts)
        ps = ParameterServer.remote(LR, size)
        every = [DataWorker.remote(w, size) for w in range(size)]
        ray.get([ps.get_weights.remote()] + [w.compute_gradients.remote(
            ps.get_weights.remote()) for w in every])  # actors up, one warm-up step
        for n in counts:
            beside(n)
            workers = every[:n]
            rt = statistics.mean(ray.get([w.round_trips.remote(ps, args.round_trips)
                                          for w in workers]))
            # the docs' asynchronous loop
            t0 = time.perf_counter()
            current_weights = ps.get_weights.remote()
            gradients = {}
            for worker in workers:
                gradients[worker.compute_gradients.remote(current_weights)] = worker
            for _ in range(args.steps * n):
                ready_gradient_list, _ = ray.wait(list(gradients))
                ready_gradient_id = ready_gradient_list[0]
                worker = gradients.pop(ready_gradient_id)
                current_weights = ps.apply_gradients.remote(*[ready_gradient_id])
                gradients[worker.compute_gradients.remote(current_weights)] = worker
            ray.get(current_weights)
            wall = time.perf_counter() - t0
            ray.get(list(gradients))  # the steps in flight past the count (not counted)
            out[n] = {"samples_per_s": args.steps * n * BATCH / wall, "round_trip_s": rt}
        return out
    finally:
        ray.shutdown()


# ---- torch.distributed.rpc: PyTorch's RPC parameter-server tutorial -------------------


def call_method(method, rref, *args, **kwargs):
    return method(rref.local_value(), *args, **kwargs)


def remote_method(method, rref, *args, **kwargs):
    import torch.distributed.rpc as rpc

    args = [method, rref] + list(args)
    return rpc.rpc_sync(rref.owner(), call_method, args=args, kwargs=kwargs)


class ParameterServer(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LR)

    def forward(self, inp):
        return self.model(inp)

    def get_dist_gradients(self, cid):
        import torch.distributed.autograd as dist_autograd

        grads = dist_autograd.get_gradients(cid)
        return {k.to("cpu"): v.to("cpu") for k, v in grads.items()}

    def get_param_rrefs(self):
        import torch.distributed.rpc as rpc

        return [rpc.RRef(param) for param in self.model.parameters()]

    def update_and_fetch_model(self, grads):
        """The batch-RPC tutorial's push+pull (without its batching: one worker's push)."""
        for p, g in zip(self.model.parameters(), grads):
            p.grad = g
        self.optimizer.step()
        self.optimizer.zero_grad()
        return [p.detach().clone() for p in self.model.parameters()]


_server = None


def get_parameter_server(model_args):
    global _server
    if _server is None:
        args, workers = model_args
        _server = ParameterServer(make_job(config(args, workers)).build_model())
    return _server


def _rpc_rank(rank: int, world: int, args, port: int, out: str) -> None:
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc
    from torch.distributed.optim import DistributedOptimizer

    torch.set_num_threads(1)
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}",
                                           num_worker_threads=8)
    name = "parameter_server" if rank == 0 else f"trainer_{rank}"
    rpc.init_rpc(name, rank=rank, world_size=world, rpc_backend_options=opts)
    if rank != 0:
        workers = world - 1
        job = make_job(config(args, workers))
        ps_rref = rpc.remote("parameter_server", get_parameter_server, args=((args, workers),))
        # the round trip (no compute): a push, the server's step, the weights back
        grads = [torch.zeros_like(p) for p in job.build_model().parameters()]
        remote_method(ParameterServer.update_and_fetch_model, ps_rref, grads)
        t0 = time.perf_counter()
        for _ in range(args.round_trips):
            remote_method(ParameterServer.update_and_fetch_model, ps_rref, grads)
        rt = (time.perf_counter() - t0) / args.round_trips
        # the tutorial's training loop
        param_rrefs = remote_method(ParameterServer.get_param_rrefs, ps_rref)
        opt = DistributedOptimizer(torch.optim.SGD, param_rrefs, lr=LR)
        data = batches(job, rank - 1, workers)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            x, target = next(data)
            with dist_autograd.context() as cid:
                model_output = remote_method(ParameterServer.forward, ps_rref, x)
                loss = loss_of(model_output, target)
                dist_autograd.backward(cid, [loss])
                assert remote_method(ParameterServer.get_dist_gradients, ps_rref, cid) != {}
                opt.step(cid)
        Path(out, str(rank)).write_text(json.dumps(
            {"wall": time.perf_counter() - t0, "round_trip_s": rt}))
    rpc.shutdown()


def rpc_peer(args, workers: int) -> dict[str, float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        # forked from this process (torch already imported): a spawned interpreter per
        # rank would spend seconds importing it again
        mp.start_processes(_rpc_rank, args=(workers + 1, args, port, out), nprocs=workers + 1,
                           start_method="fork")
        runs = [json.loads(p.read_text()) for p in Path(out).iterdir()]
    return {"samples_per_s": workers * args.steps * BATCH / max(r["wall"] for r in runs),
            "round_trip_s": statistics.mean(r["round_trip_s"] for r in runs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer steps, under a minute")
    ap.add_argument("--model", default="lenet5")
    ap.add_argument("--data", default="synthetic")
    ap.add_argument("--peers", default="ray,rpc", help="which peers (comma-separated)")
    args = ap.parse_args()
    # quick: 60 steps (a 30-step run of ours lasted ~0.15 s: one scheduling hiccup on a
    # loaded machine moved it by 2x), 30 round trips
    args.steps, args.round_trips = (60, 30) if args.quick else (200, 200)
    counts = (1, 2, 4)
    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    peers = [p for p in args.peers.split(",") if p]
    results: dict[str, dict[int, dict[str, float]]] = {"phalanx": {}}
    # ours is measured next to each peer (just after RPC's run, just before Ray's), and
    # each ratio uses that run
    beside: dict[str, dict[int, float]] = {p: {} for p in peers}
    spent: dict[str, float] = {}
    t0 = time.perf_counter()
    for n in counts:
        results["phalanx"][n] = {"round_trip_s": phalanx_round_trip_s(args, n)}
        if "rpc" in peers:  # forked ranks: before Ray starts its threads in this process
            results.setdefault("rpc", {})[n] = rpc_peer(args, n)
            beside["rpc"][n] = phalanx_samples_per_s(args, n)
    spent["phalanx_and_rpc"] = time.perf_counter() - t0
    if "ray" in peers:
        t0 = time.perf_counter()
        results["ray"] = ray_peer(args, list(counts), lambda n: beside["ray"].__setitem__(
            n, phalanx_samples_per_s(args, n)))
        spent["phalanx_and_ray"] = time.perf_counter() - t0
    for n in counts:
        runs = [beside[p][n] for p in peers] or [phalanx_samples_per_s(args, n)]
        results["phalanx"][n]["samples_per_s"] = statistics.median(runs)
        results["phalanx"][n]["samples_per_s_beside"] = {p: beside[p][n] for p in peers}
    ratios, targets = {}, {}
    for n in counts:
        if not peers:
            continue
        # the faster peer is the one ours leads by less, each against ours measured beside it
        ratio = {p: beside[p][n] / results[p][n]["samples_per_s"] for p in peers}
        ratios[f"samples_per_s_n{n}_over_faster_peer"] = min(ratio.values())
        for p in peers:
            ratios[f"samples_per_s_n{n}_over_{p}"] = ratio[p]
        fastest_rt = min(results[p][n]["round_trip_s"] for p in peers)
        # above 1: ours is faster (the faster peer's round trip over ours)
        ratios[f"round_trip_n{n}_speedup_over_faster_peer"] = (
            fastest_rt / results["phalanx"][n]["round_trip_s"])
        targets[f"samples_per_s_n{n}_over_faster_peer"] = 1.5
    _common.emit(
        "ps_peers",
        {"load_1min_before": round(load_before, 2),
         "load_1min_after": round(os.getloadavg()[0], 2), "model": args.model,
         "data": args.data, "batch": BATCH, "steps_per_worker": args.steps,
         "round_trips": args.round_trips, "cores": os.cpu_count(),
         "bench_seconds": {k: round(v, 1) for k, v in spent.items()},
         "per_system": {k: {str(n): v for n, v in r.items()} for k, r in results.items()}},
        ratios, targets)


if __name__ == "__main__":
    main()
