"""Parameter averaging (local SGD): every worker trains on its own shard with its own
optimizer for ``--period`` steps, then the workers average their parameters (and BN
buffers) with an allreduce. ``--average-optimizer-state`` also averages the rule's state
(momentum, AdaGrad sums, ...): more traffic, as the seeds warn.

With period 1 and plain SGD this equals synchronous gradient averaging (the average of
``w - lr g_i`` is ``w - lr mean(g_i)``). With a linear state (heavy-ball momentum) it still
does at period 1, because the mean of the workers' momentum buffers follows the same
recursion as the momentum of the mean gradient; with AdaGrad / Adam (non-linear state)
or a period above 1 it does not.

Checkpoints (``--checkpoint-every``, a multiple of ``--period``: replicas are equal only
right after a round) hold every worker's own optimizer state; resume and
``--kill-worker`` work as for ``sync`` (:mod:`phalanx.parallel.dp_checkpoint`).
"""

from __future__ import annotations

import time

import torch
from torch import nn

from phalanx.comm.allreduce import AllReduce, make_allreduce
from phalanx.comm.counters import ByteCounter
from phalanx.comm.exchange import group_screened
from phalanx.comm.staging import staged
from phalanx.config import RunConfig
from phalanx.errors import ConfigError
from phalanx.metrics import EventLog
from phalanx.parallel.base import (
    GradAccumulator,
    Job,
    Outcome,
    detached,
    read_result,
    write_result,
)
from phalanx.parallel.device_data import DeviceData, train_bytes
from phalanx.parallel.dp_checkpoint import (
    Position,
    check_checkpointing,
    check_resume,
    has_checkpoint,
    spawn_workers,
)
from phalanx.parallel.outer_step import OuterSync
from phalanx.parallel.spec import StrategySpec, workers_momentum
from phalanx.parallel.stats import AveragingStats
from phalanx.parallel.sync_dp import (
    DEVICE,
    WorkerContext,
    broadcast_from_rank0,
    check_shards,
    open_log,
    total_bytes,
    total_steps,
    worker_batches,
)
from phalanx.parallel.worker import WorkerKit
from phalanx.rules import apply_updates, make_rule, state_tensors
from phalanx.runtime import preempt
from phalanx.runtime.placement import setup_rank, spawn_backend

__all__ = ["average_", "can_restart", "check_resume", "process_main", "run", "train_worker",
           "world_size"]


def world_size(cfg: RunConfig) -> int:
    return cfg.workers


def run(job: Job, log: EventLog) -> Outcome:
    check_shards(job, world_size(job.config))
    check_config(job.config)
    if job.config.resume:
        check_resume(job.config)
    spawn_workers(job, process_main, world_size(job.config),
                  backend=spawn_backend(job.config, world_size(job.config), DEVICE))
    return read_result(job)


def check_config(cfg: RunConfig) -> None:
    if cfg.sfb:
        raise ConfigError("--sfb: sufficient factors apply to gradients; use --strategy sync")
    check_checkpointing(cfg, cfg.period)


def can_restart(cfg: RunConfig) -> bool:
    """For ``phalanx.entry.torchrun`` on a restarted attempt: is there a checkpoint to resume?"""
    return has_checkpoint(cfg)


def process_main(rank: int, world: int, job: Job) -> None:
    """One worker; runs inside an initialised process group (spawn or torchrun)."""
    check_config(job.config)  # again here: under torchrun no driver checked first
    place = setup_rank(job.config, rank, world, DEVICE, data_bytes=train_bytes(job))
    with open_log(job, rank) as log:
        train_worker(WorkerContext(job, rank, world, log, time.perf_counter(), place))


def average_(tensors: list[torch.Tensor], allreduce: AllReduce, world: int) -> None:
    """Replace each tensor by its mean over the group (one flat allreduce)."""
    if world == 1 or not tensors:
        return
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    allreduce(flat)
    flat.div_(world)
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n


def train_worker(ctx: WorkerContext) -> nn.Module:
    """The local-SGD loop of one worker; returns the final averaged model."""
    job, rank, world = ctx.job, ctx.rank, ctx.world
    cfg = job.config
    place = ctx.placement
    model = job.build_model().to(place.torch_device)
    model.train()
    counter = ByteCounter()
    params = [p for p in model.parameters() if p.requires_grad]
    broadcast_from_rank0(params + list(model.buffers()), counter, rank, world)
    allreduce = staged(make_allreduce(cfg.allreduce, counter=counter), place.host_staging)
    buffers = [b for b in model.buffers() if b.is_floating_point()]

    total = total_steps(job, world)
    weights = detached(params)
    rule = make_rule(cfg, total)
    state = rule.init(weights)
    kit = WorkerKit.of(cfg, rank)
    data = DeviceData(job.train, place.torch_device, place.data_on_device,
                      kit.aug is not None)
    # each worker's optimizer state is its own (unless averaged): checkpointed per rank
    ckpt = ctx.checkpointer(shared_rule_state=False)
    pos = ckpt.restore(model, state, kit.gen, counter) if cfg.resume else Position()
    ctx.t0 -= pos.wall_s
    report = ctx.reporter(total, f"average x{world}")

    # --compress / --outer-rule: compressed deltas and the DiLoCo outer step
    outer = OuterSync(cfg, weights, allreduce, world) if OuterSync.wanted(cfg) else None

    def synchronise() -> None:
        # sync point: every worker blocks here until all have finished their period
        if outer is not None:
            outer.sync(weights)
            average_(buffers, allreduce, world)
        else:
            average_(weights + buffers, allreduce, world)
        if cfg.average_optimizer_state:
            # integer leaves (step counts) are equal on every worker; average the rest
            average_([t for t in state_tensors(state) if t.is_floating_point()], allreduce,
                     world)

    step, samples, last_epoch, rounds = pos.step, pos.samples, pos.epoch, pos.rounds
    micro = step * cfg.grad_accum
    accumulator = GradAccumulator(cfg.grad_accum)
    for epoch, idx in worker_batches(job, rank, world, skip=micro):
        if step >= total:
            break  # resumed from the final checkpoint: nothing left to do
        if micro % cfg.grad_accum == 0:
            ckpt.maybe_kill(step)
        if epoch != last_epoch:
            report.maybe_eval(model, job.test, step, last_epoch, samples * world,
                              epoch_ended=True)
            last_epoch = epoch
        x, y = data.batch(idx, kit.aug, kit.gen)
        kit.straggler.start()
        out = model(x)
        loss = kit.loss_fn(out, y)
        g = torch.autograd.grad(loss, params)
        kit.straggler.finish()
        micro += 1
        samples += len(idx)
        grads = accumulator.add(g)
        if grads is None:
            continue
        updates, state = rule.update(grads, state, weights)
        apply_updates(weights, updates)
        step += 1
        if step % cfg.period == 0 or step == total:
            synchronise()
            rounds += 1
        report.step(step, epoch, loss, out, y, samples, bytes_sent=counter.sent,
                    rounds=rounds)
        report.maybe_eval(model, job.test, step, epoch, samples * world, epoch_ended=False)
        # a scheduler's SIGTERM (runtime/preempt), asked right after an averaging round
        stop = step < total and step % cfg.period == 0 and preempt.agreed()
        if stop or ckpt.due(step, final=step == total):  # a multiple of --period: averaged
            ckpt.save(model, state, Position(step, epoch, samples, rounds, report.wall()),
                      kit.gen, counter)
        if stop:
            raise preempt.Preempted(step)
        if step >= total:
            break
    report.close()
    report.maybe_eval(model, job.test, step, last_epoch, samples * world, epoch_ended=True)
    sent = total_bytes(counter)
    screened = group_screened(outer.compression if outer is not None else None)
    if rank == 0:
        stats = AveragingStats(
            bytes_sent=sent, bytes_per_sample=sent / max(samples * world, 1),
            allreduce=cfg.allreduce, period=cfg.period,
            average_optimizer_state=cfg.average_optimizer_state, averaging_rounds=rounds,
            bytes_estimated=allreduce.estimated, compress=cfg.compress,
            outer_rule=cfg.outer_rule, contributions_skipped=screened.skipped,
            values_clipped=screened.values_clipped)
        write_result(job, model.state_dict(), train_samples=samples * world, steps=step,
                     stats=stats)
    return model


SPEC = StrategySpec(
    "average", "parameter averaging (local SGD) every --period steps; DiLoCo with "
    "--outer-rule", run, process_main, world_size, check=check_config,
    check_resume=check_resume, can_restart=can_restart,
    supports=frozenset({"kill_worker", "compress", "powersgd", "outer_rule"}),
    options=("period", "average_optimizer_state", "sfb", "outer_lr", "outer_momentum"),
    shards_by="workers", device=DEVICE,
    default_rule=workers_momentum)  # N x fewer steps per epoch: docs/data-parallel.md
