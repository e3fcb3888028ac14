"""The whole parameter server (server loop, client, worker loop) on the in-process
transport, checked against oracles: large-batch SGD, the single-worker loop, ASP."""

import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from phalanx.comm.transport import InProcNetwork
from phalanx.config import RunConfig
from phalanx.data import epoch_batches
from phalanx.entry.api import make_job
from phalanx.errors import PhalanxError
from phalanx.metrics import EventLog
from phalanx.parallel import single
from phalanx.parallel.base import read_result
from phalanx.parallel.ps import make_shard, server_main, worker_main
from phalanx.ps.client import PSClient
from phalanx.ps.partition import flat_dense, partition, trainable, unflatten_into
from phalanx.ps.server import Layout, serve


def job_for(tmp_path: Path, **options):
    values = {"model": "mlp", "data": "synthetic", "batch_size": 16, "max_steps": 50,
              "lr": 0.05, "progress": False, "tensorboard": False,
              "out": str(tmp_path / "run"), "ps_timeout": 30.0}
    values.update(options)
    return make_job(RunConfig.from_mapping(values).validate())


def run_threads(job):
    """Every rank of a PS run as a thread on the in-process transport."""
    cfg = job.config
    layout = Layout(cfg.servers, cfg.workers)
    net = InProcNetwork(layout.world)
    job.run_dir.mkdir(parents=True, exist_ok=True)
    errors = []
    # threads share torch's global RNG: build_model (seed, then init) must not interleave,
    # or ranks would start from different weights (processes each have their own RNG)
    lock, build = threading.Lock(), job.build_model

    def build_locked():
        with lock:
            return build()

    job.build_model = build_locked

    def rank_main(rank):
        try:
            log = EventLog(None, rank=rank)
            if rank < layout.servers:
                server_main(job, net.transport(rank), layout, rank, log)
            else:
                worker_main(job, net.transport(rank), layout, rank - layout.servers, log)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            errors.append(e)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(layout.world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return read_result(job)


def test_bsp_equals_large_batch_sgd(tmp_path):
    workers, steps = 3, 50
    job = job_for(tmp_path, strategy="bsp", workers=workers, servers=2, max_steps=steps)
    outcome = run_threads(job)
    # oracle: one process, batch = the N workers' batches of the same step, plain SGD
    model = job.build_model()
    params = trainable(model)
    streams = [epoch_batches(job.shard(w, workers), 16, 0, job.config.seed)
               for w in range(workers)]
    for _ in range(steps):
        idx = torch.cat([next(s) for s in streams])
        loss = nn.functional.cross_entropy(model(job.train.x[idx]), job.train.y[idx])
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= 0.05 * g
    assert outcome.steps == steps and outcome.stats["staleness_max"] == 0
    for p, q in zip(params, trainable(outcome.model)):
        assert torch.allclose(p, q, atol=1e-6, rtol=0), (p - q).abs().max()
    assert max((p - q).abs().max() for p, q in zip(params, job.build_model().parameters())) > 1e-3


def test_asp_with_one_worker_equals_the_single_worker_loop_exactly(tmp_path):
    job = job_for(tmp_path, strategy="asp", workers=1, servers=2, rule="momentum", lr=0.02)
    outcome = run_threads(job)
    ref_job = job_for(tmp_path / "single", strategy="single", rule="momentum", lr=0.02)
    ref = single.run(ref_job, EventLog(None))
    for p, q in zip(ref.model.parameters(), outcome.model.parameters()):
        assert torch.equal(p, q)
    assert outcome.stats["staleness_histogram"] == [100]  # 50 steps x 2 shards, all fresh


def drive_round_robin(job, steps):
    """Workers in one thread, in a fixed order: all pull, then all push, each step. The
    servers run as threads; the result is deterministic because each shard processes its
    single mailbox in arrival order."""
    cfg = job.config
    layout = Layout(cfg.servers, cfg.workers)
    net = InProcNetwork(layout.world)
    shards = [make_shard(job, k) for k in range(cfg.servers)]
    threads = [threading.Thread(target=serve, args=(s, net.transport(k), layout, 30.0))
               for k, s in enumerate(shards)]
    for t in threads:
        t.start()
    models = [job.build_model() for _ in range(cfg.workers)]
    part = partition(models[0], cfg.servers)
    clients = [PSClient(net.transport(layout.worker_rank(w)), part, layout, w, 30.0)
               for w in range(cfg.workers)]
    streams = [epoch_batches(job.shard(w, cfg.workers), cfg.batch_size, 0, cfg.seed)
               for w in range(cfg.workers)]
    for step in range(steps):
        grads, versions = [], []
        for w, (model, client) in enumerate(zip(models, clients)):
            flat = flat_dense(part, trainable(model))
            client.pull(step, flat)
            unflatten_into(part, flat, trainable(model))
            versions.append(list(client.versions))
            idx = next(streams[w])
            loss = nn.functional.cross_entropy(model(job.train.x[idx]), job.train.y[idx])
            grads.append(flat_dense(part, list(torch.autograd.grad(loss, trainable(model)))))
        for w, client in enumerate(clients):
            client.push(step, grads[w], versions[w])
    for client in clients:
        client.done(steps, torch.zeros(4, dtype=torch.float64))
    for t in threads:
        t.join(60)
    return torch.cat([s.dense for s in shards]), shards


def test_dc_asgd_with_lambda_zero_equals_asp_exactly(tmp_path):
    base = job_for(tmp_path, strategy="asp", workers=3, servers=2, rule="sgd")
    asp, shards = drive_round_robin(base, 12)
    # every step each worker w pulled before the w pushes ahead of it: staleness w
    assert shards[0].stats.histogram() == [12, 12, 12]
    dc0, _ = drive_round_robin(replace(base, config=replace(base.config, strategy="dc-asgd",
                                                            dc_lambda=0.0)), 12)
    assert torch.equal(asp, dc0)
    dc, _ = drive_round_robin(replace(base, config=replace(base.config, strategy="dc-asgd",
                                                           dc_lambda=2.0)), 12)
    assert not torch.equal(asp, dc)  # compensation does act when lambda > 0


def test_silent_worker_ends_the_server_with_an_error_naming_it(tmp_path):
    job = job_for(tmp_path, strategy="asp", workers=2, servers=1)
    layout = Layout(1, 2)
    net = InProcNetwork(3)
    state = make_shard(job, 0)
    part = partition(job.build_model(), 1)
    stop = threading.Event()

    def busy_worker():  # worker 0 keeps pushing; worker 1 never says anything
        client = PSClient(net.transport(1), part, layout, 0, 5.0)
        flat = torch.zeros(part.dense_numel)
        clock = 0
        try:
            while not stop.is_set():
                client.pull(clock, flat)
                client.push(clock, torch.zeros(part.dense_numel))
                clock += 1
        except PhalanxError:
            assert stop.wait(10)  # only once the server has given up (no answer)

    t = threading.Thread(target=busy_worker, daemon=True)
    t.start()
    with pytest.raises(PhalanxError, match=r"worker\(s\) \[1\] silent"):
        serve(state, net.transport(0), layout, timeout_s=0.3)
    stop.set()
    # nobody talks at all: the receive itself times out, naming both workers
    with pytest.raises(PhalanxError, match=r"worker\(s\) \[0, 1\] sent nothing for 0.2 s"):
        serve(make_shard(job, 0), InProcNetwork(3).transport(0), layout, timeout_s=0.2)


def bag_of_ids():
    """A model whose first layer is an embedding: its table is served row by row."""
    return nn.Sequential(nn.EmbeddingBag(1000, 8, mode="mean"), nn.Linear(8, 4))


def id_data():
    from phalanx.data import Dataset

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 500, (800, 5), generator=g)  # rows 500.. are never used
    y = (x[:, 0] % 4).long()  # learnable from the ids
    return Dataset("ids", x[:600], y[:600], 4), Dataset("ids", x[600:], y[600:], 4)


def test_sparse_table_asp_one_worker_equals_single_and_moves_rows_only(tmp_path):
    from phalanx.ps.partition import find_table

    assert find_table(bag_of_ids()) is not None
    options = {"batch_size": 20, "max_steps": 25, "lr": 0.5, "progress": False,
               "tensorboard": False, "ps_timeout": 30.0}
    cfg = RunConfig.from_mapping({**options, "strategy": "asp", "workers": 1, "servers": 3,
                                  "out": str(tmp_path / "ps")}).validate()
    job = make_job(cfg, bag_of_ids, id_data())
    outcome = run_threads(job)
    ref_cfg = RunConfig.from_mapping({**options, "strategy": "single",
                                      "out": str(tmp_path / "single")}).validate()
    ref = single.run(make_job(ref_cfg, bag_of_ids, id_data()), EventLog(None))
    for p, q in zip(ref.model.parameters(), outcome.model.parameters()):
        assert torch.allclose(p, q, atol=1e-6, rtol=0)
    # rows no sample uses never moved (and were never sent anywhere); the others did
    init, final = job.build_model()[0].weight, outcome.model[0].weight
    assert torch.equal(init[500:], final[500:]) and not torch.equal(init[:500], final[:500])
    # a step moves the batch's rows only: far fewer bytes than pulling + pushing the table
    table_bytes = 1000 * 8 * 4
    assert outcome.stats["bytes_sent"] / 25 < 0.5 * 2 * table_bytes
