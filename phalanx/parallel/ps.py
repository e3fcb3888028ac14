"""The parameter-server family: bsp, asp, ssp, softsync, downpour, dc-asgd.

World layout: ranks ``0..S-1`` are server shards (``--servers S``), ranks ``S..S+N-1``
are workers ``0..N-1`` (``--workers N``). Every strategy is the same server and worker
code with a different consistency model and server rule:

* bsp: a barrier each step; ``--rule`` on the average of the N gradients;
* asp: no waiting; every push applied at once;
* ssp: a worker may be at most ``--staleness`` clocks ahead of the slowest;
* softsync: the average of every ``--softsync`` n pushes is applied;
* downpour: ASP, pull every ``--nfetch`` steps, push summed gradients every ``--npush``
  steps (the server's ``--rule``, e.g. adagrad, keeps the optimizer state);
* dc-asgd: ASP with delay compensation (``--dc-lambda``, ``--dc-adaptive``) before ``--rule``.

``--staleness-lr`` divides every applied step by its staleness, for any of them.
Worker 0 evaluates the current server weights once per epoch (or every ``--eval-every``
steps); server 0 assembles the final model and writes the result.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from phalanx.comm.counters import nbytes
from phalanx.comm.transport import GlooTransport, Transport
from phalanx.comm.wire import HEADER_BYTES
from phalanx.config import RunConfig
from phalanx.data import epoch_batches
from phalanx.errors import ConfigError, PhalanxError
from phalanx.metrics import EventLog, Progress
from phalanx.parallel.base import (
    Job,
    Outcome,
    Straggler,
    augmenter,
    evaluate,
    read_result,
    write_result,
)
from phalanx.ps.client import PSClient
from phalanx.ps.consistency import consistency_for
from phalanx.ps.partition import flat_dense, partition, trainable, unflatten_into
from phalanx.ps.server import Layout, ShardResult, gather_final, send_final, serve
from phalanx.ps.shard import ShardState
from phalanx.rules import UpdateRule, dc_asgd, make_rule, staleness_scaled

LOG_EVERY = 10
WORKER_STATS = ("samples", "steps", "bytes_sent", "bytes_received")


def world_size(cfg: RunConfig) -> int:
    return cfg.servers + cfg.workers


def check_config(cfg: RunConfig) -> None:
    if cfg.strategy != "downpour" and (cfg.nfetch != 1 or cfg.npush != 1):
        raise ConfigError(f"--nfetch/--npush: only --strategy downpour uses them "
                          f"(got --strategy {cfg.strategy})")
    if cfg.grad_accum != 1:
        raise ConfigError(f"--grad-accum: not supported by --strategy {cfg.strategy} "
                          "(use --strategy downpour with --npush)")


def run(job: Job, log: EventLog) -> Outcome:
    from phalanx.runtime.launch import spawn

    check_config(job.config)
    spawn(process_main, world_size(job.config), (job,),
          timeout_s=max(120.0, 2 * job.config.ps_timeout))
    return read_result(job)


def process_main(rank: int, world: int, job: Job) -> None:
    cfg = job.config
    check_config(cfg)
    layout = Layout(cfg.servers, cfg.workers)
    if world != layout.world:
        raise PhalanxError(f"{world} processes, but --servers {cfg.servers} + --workers "
                           f"{cfg.workers} need {layout.world}")
    transport = GlooTransport(rank, world)
    role = "server" if rank < layout.servers else "worker"
    tb = job.run_dir / "tensorboard" if cfg.tensorboard else None
    with EventLog(job.run_dir / "events.jsonl", rank=rank, role=role, tensorboard_dir=tb) as log:
        if rank < layout.servers:
            server_main(job, transport, layout, rank, log)
        else:
            worker_main(job, transport, layout, rank - layout.servers, log)


# ---- configuration helpers (shared by processes and the in-process tests) ---------------


def steps_per_worker(job: Job) -> int:
    """Every worker takes the same number of steps (the smallest shard decides), so BSP and
    SSP never wait on a worker that has stopped early."""
    n = job.config.workers
    return min(job.planned_steps(len(job.shard(w, n))) for w in range(n))


def server_updates(cfg: RunConfig, steps: int) -> int:
    """How many updates a shard applies (the horizon of an lr schedule)."""
    pushes = math.ceil(steps / cfg.npush)
    if cfg.strategy == "bsp":
        return pushes
    if cfg.strategy == "softsync":
        return math.ceil(cfg.workers * pushes / cfg.softsync)
    return cfg.workers * pushes


def server_rule(cfg: RunConfig, total_updates: int) -> UpdateRule:
    prefix: list[UpdateRule] = []
    if cfg.strategy == "dc-asgd":
        prefix.append(dc_asgd(cfg.dc_lambda, cfg.dc_adaptive, cfg.dc_momentum))
    if cfg.staleness_lr:
        prefix.append(staleness_scaled())
    return make_rule(cfg, total_updates, prefix=tuple(prefix))


def make_shard(job: Job, shard: int, log=None) -> ShardState:
    cfg = job.config
    model = job.build_model()
    part = partition(model, cfg.servers)
    params = trainable(model)
    a, b = part.dense_range(shard)
    rows = params[part.table.param].detach()[shard :: cfg.servers] if part.table else None
    return ShardState(shard, part, flat_dense(part, params)[a:b], rows,
                      server_rule(cfg, server_updates(cfg, steps_per_worker(job))),
                      consistency_for(cfg.strategy, staleness=cfg.staleness,
                                      softsync=cfg.softsync),
                      cfg.workers, keep_backups=cfg.strategy == "dc-asgd", log=log)


# ---- server processes ----------------------------------------------------------------


def server_main(job: Job, transport: Transport, layout: Layout, shard: int,
                log: EventLog) -> None:
    cfg = job.config
    state = make_shard(job, shard, log.log)
    early = serve(state, transport, layout, cfg.ps_timeout)
    if shard != 0:
        send_final(state, transport, layout)
        return
    results = gather_final(state, transport, layout, early, cfg.ps_timeout)
    model, samples, steps, stats = assemble(job, state.part, results)
    log.log("ps_stats", **stats)
    write_result(job, model.state_dict(), train_samples=samples, steps=steps, stats=stats)
    transport.flush()


def assemble(job: Job, part, results: list[ShardResult]) -> tuple[nn.Module, int, int, dict]:
    """The final model from the shards' parameters (+ worker 0's buffers), and the stats."""
    cfg = job.config
    model = job.build_model()
    params = trainable(model)
    unflatten_into(part, torch.cat([r.dense for r in results]), params)
    with torch.no_grad():
        if part.table is not None:
            for r in results:
                params[part.table.param][r.shard :: part.shards] = r.rows
        worker_stats = results[0].worker_stats
        if 0 in worker_stats and len(worker_stats[0]) > 1:
            # buffers (BatchNorm statistics) are not served by the PS: take worker 0's
            flat, offset = worker_stats[0][1], 0
            for buf in model.buffers():
                buf.copy_(flat[offset : offset + buf.numel()].view_as(buf).to(buf.dtype))
                offset += buf.numel()
    per_worker = {w: dict(zip(WORKER_STATS, t[0].tolist())) for w, t in worker_stats.items()}
    samples = int(sum(s["samples"] for s in per_worker.values()))
    steps = int(max((s["steps"] for s in per_worker.values()), default=0))
    hist = [0] * max(len(r.histogram) for r in results)
    for r in results:
        for s, c in enumerate(r.histogram):
            hist[s] += c
    applied = sum(hist)
    bytes_sent = int(sum(r.stat("bytes_sent") for r in results)
                     + sum(s["bytes_sent"] for s in per_worker.values()))
    stats = {
        "consistency": consistency_for(cfg.strategy, staleness=cfg.staleness,
                                       softsync=cfg.softsync).name,
        "servers": cfg.servers,
        "staleness_mean": sum(s * c for s, c in enumerate(hist)) / applied if applied else 0.0,
        "staleness_max": len(hist) - 1 if hist else 0,
        "staleness_histogram": hist,
        "pushes_applied": int(sum(r.stat("pushes_applied") for r in results)),
        "pushes_rejected": int(sum(r.stat("pushes_rejected") for r in results)),
        "messages_rejected": int(sum(r.stat("messages_rejected") for r in results)),
        "server_updates": int(results[0].stat("updates")),
        "bytes_sent": bytes_sent,
        "bytes_per_sample": bytes_sent / samples if samples else 0.0,
    }
    return model, samples, steps, stats


# ---- worker processes ----------------------------------------------------------------


def worker_main(job: Job, transport: Transport, layout: Layout, worker: int,
                log: EventLog) -> None:
    cfg = job.config
    model = job.build_model()
    model.train()
    params = trainable(model)
    part = partition(model, cfg.servers)
    flat = flat_dense(part, params)
    table = params[part.table.param] if part.table else None
    # a worker waits longer than a server: when a peer dies, the server (which knows who is
    # silent) should be the one to end the run, with the better message
    client = PSClient(transport, part, layout, worker, 2 * cfg.ps_timeout + 10)
    shard = job.shard(worker, cfg.workers)
    total = steps_per_worker(job)
    straggler = Straggler(cfg.slow_workers.get(worker, 1.0))
    aug = augmenter(cfg)
    gen = torch.Generator().manual_seed(cfg.seed + 1 + worker)
    loss_fn = nn.CrossEntropyLoss()
    progress = Progress(total, cfg.strategy, enabled=cfg.progress and worker == 0)

    def pull(clock: int, rows: torch.Tensor | None, dense: bool) -> None:
        with torch.no_grad():
            client.pull(clock, flat if dense else None, rows,
                        table.data if table is not None else None)
        if dense:
            unflatten_into(part, flat, params)

    def evaluate_now(step: int, epoch: int, samples: int, clock: int) -> None:
        pull(clock, None, dense=True)  # evaluate the servers' weights, not a stale copy
        loss, acc = evaluate(model, job.test)
        log.log("eval", step=step, epoch=epoch, samples=samples * cfg.workers, test_loss=loss,
                test_accuracy=acc, wall_s=time.perf_counter() - t0)

    step = clock = samples = epoch = 0
    acc_dense = acc_versions = None
    acc_rows: list[torch.Tensor] = []
    acc_row_grads: list[torch.Tensor] = []
    t0 = time.perf_counter()
    while step < total:
        for idx in epoch_batches(shard, cfg.batch_size, epoch, cfg.seed):
            x, y = job.train.x[idx], job.train.y[idx]
            if aug is not None:
                x = aug(x, gen)
            rows = x.unique() if table is not None else None
            if step % cfg.nfetch == 0:
                pull(clock, rows, dense=True)  # BSP / SSP workers wait here
            elif rows is not None:
                pull(clock, rows, dense=False)  # this batch's table rows are always fresh
            if acc_versions is None:
                acc_versions = list(client.versions)  # staleness counts from this pull
            straggler.start()
            out = model(x)
            loss = loss_fn(out, y)
            grads = torch.autograd.grad(loss, params)
            straggler.finish()
            g = flat_dense(part, list(grads))
            acc_dense = g if acc_dense is None else acc_dense + g
            if table is not None:
                acc_rows.append(rows)
                acc_row_grads.append(grads[part.table.param][rows])
            step += 1
            samples += len(idx)
            if step % cfg.npush == 0 or step == total:
                ids = row_grads = None
                if table is not None:
                    ids, row_grads = _coalesce(acc_rows, acc_row_grads)
                client.push(clock, acc_dense, acc_versions, ids, row_grads)
                clock += 1
                acc_dense = acc_versions = None
                acc_rows, acc_row_grads = [], []
            if step % LOG_EVERY == 0 or step == total:
                acc = (out.argmax(1) == y).float().mean().item()
                log.log("train", step=step, epoch=epoch, loss=loss.item(), accuracy=acc,
                        samples=samples, wall_s=time.perf_counter() - t0,
                        bytes_sent=transport.counter.sent)
                progress.update(step, loss=loss.item())
            if worker == 0 and cfg.eval_every and step % cfg.eval_every == 0:
                evaluate_now(step, epoch, samples, clock)
            if step >= total:
                break
        epoch += 1
        if worker == 0 and not cfg.eval_every:
            evaluate_now(step, epoch, samples, clock)
    progress.close()
    extra = []
    if worker == 0:
        bufs = [b.detach().reshape(-1).double() for b in model.buffers()]
        extra = [torch.cat(bufs) if bufs else torch.zeros(0, dtype=torch.float64)]
    stats = torch.zeros(len(WORKER_STATS), dtype=torch.float64)
    # count the DONE messages themselves in bytes_sent
    done_bytes = part.shards * (HEADER_BYTES + nbytes(stats)) + nbytes(*extra)
    stats[:] = torch.tensor([samples, step, transport.counter.sent + done_bytes,
                             transport.counter.received], dtype=torch.float64)
    client.done(clock, stats, extra)


def _coalesce(rows: list[torch.Tensor], grads: list[torch.Tensor]):
    """Sum the row gradients of several steps (Downpour's npush) into one row per id."""
    ids = torch.cat(rows)
    uniq, inverse = torch.unique(ids, return_inverse=True)
    dim = grads[0].shape[-1]
    out = torch.zeros(len(uniq), dim, dtype=grads[0].dtype)
    out.index_add_(0, inverse, torch.cat(grads).view(-1, dim))
    return uniq, out
