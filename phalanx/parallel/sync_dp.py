"""Synchronous data parallel: every worker computes a gradient on its own shard, the
gradients are averaged with an allreduce (ring, native or main-node) bucket by bucket
while backward runs, and every worker applies the same update rule to the same average —
so the replicas stay identical without ever exchanging parameters after the start.

``--sfb`` sends sufficient factors instead of the weight gradient of the fully connected
layers where that is smaller (see :mod:`phalanx.comm.sfb`).

Faults (:mod:`phalanx.parallel.dp_checkpoint`): checkpoints every ``--checkpoint-every``
steps, ``--resume DIR`` / a torchrun restart continues the same trajectory, and
``--kill-worker RANK@STEP`` crashes a worker.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from phalanx.comm.allreduce import make_allreduce
from phalanx.comm.bucketing import CommThread, GradReducer
from phalanx.comm.counters import ByteCounter
from phalanx.comm.exchange import Compression, group_screened
from phalanx.comm.sfb import SufficientFactors
from phalanx.comm.staging import gloo_carries, staged
from phalanx.config import RunConfig
from phalanx.data import epoch_batches, steps_per_epoch
from phalanx.errors import ConfigError
from phalanx.metrics import EventLog
from phalanx.metrics.noise import JobProbe
from phalanx.parallel.base import (
    Job,
    Outcome,
    detached,
    read_result,
    write_result,
)
from phalanx.parallel.device_data import DeviceData, train_bytes
from phalanx.parallel.dp_checkpoint import (
    Checkpointer,
    Position,
    has_checkpoint,
    spawn_workers,
)
from phalanx.parallel.dp_checkpoint import check_resume as _check_resume
from phalanx.parallel.spec import StrategySpec, workers_momentum
from phalanx.parallel.stats import SyncStats
from phalanx.parallel.worker import StepReporter, WorkerKit
from phalanx.rules import apply_updates, make_rule
from phalanx.runtime import preempt
from phalanx.runtime.placement import (
    CPU,
    DeviceSupport,
    Placement,
    setup_rank,
    spawn_backend,
)

DEVICE = DeviceSupport()  # collectives between known peers: NCCL where each rank has a GPU


def world_size(cfg: RunConfig) -> int:
    return cfg.workers


def run(job: Job, log: EventLog) -> Outcome:
    check_shards(job, world_size(job.config))  # fail here, in one line, not in N children
    if job.config.resume:
        check_resume(job.config)
    spawn_workers(job, process_main, world_size(job.config),
                  backend=spawn_backend(job.config, world_size(job.config), DEVICE))
    return read_result(job)


def check_resume(cfg: RunConfig) -> None:
    """``--resume DIR``: DIR's checkpoint exists, is intact and belongs to this run."""
    _check_resume(cfg)


def can_restart(cfg: RunConfig) -> bool:
    """For ``phalanx.entry.torchrun`` on a restarted attempt: is there a checkpoint to resume?"""
    return has_checkpoint(cfg)


# ---- pieces shared with model averaging and the DDP reference in the tests ---------------

def check_shards(job: Job, world: int) -> int:
    """Micro-batches per epoch every worker takes (that of the smallest shard)."""
    cfg = job.config
    per_epoch = steps_per_epoch(len(job.train) // world, cfg.batch_size)
    if per_epoch == 0:
        raise ConfigError(f"--batch-size: {cfg.batch_size} is larger than a worker's shard "
                          f"({len(job.train) // world} samples with --workers {world})")
    return per_epoch


def worker_batches(job: Job, rank: int, world: int,
                   skip: int = 0) -> Iterator[tuple[int, torch.Tensor]]:
    """(epoch, indices) of this worker's micro-batches, forever, after the first ``skip``
    (consumed before a checkpoint). Every worker takes the same number per epoch (that of
    the smallest shard) so collectives stay matched. The order depends only on (seed,
    epoch, rank), which is what makes a resumed run continue the same trajectory."""
    cfg = job.config
    shard = job.shard(rank, world)
    per_epoch = check_shards(job, world)
    epoch = skip // per_epoch  # whole epochs skipped without drawing their permutations
    skip -= epoch * per_epoch

    def batches() -> Iterator[tuple[int, torch.Tensor]]:
        e = epoch
        while True:
            for i, idx in enumerate(epoch_batches(shard, cfg.batch_size, e, cfg.seed)):
                if i == per_epoch:
                    break
                yield e, idx
            e += 1

    return itertools.islice(batches(), skip, None)


def total_steps(job: Job, world: int) -> int:
    """Optimizer steps every worker takes."""
    return job.planned_steps(len(job.train) // world)


def broadcast_from_rank0(tensors: list[torch.Tensor], counter: ByteCounter, rank: int,
                         world: int) -> None:
    """Start every replica from rank 0's values (a user model with random init, or BN
    buffers): one flat broadcast."""
    if world == 1 or not tensors:
        return
    flat = torch.cat([t.detach().reshape(-1).float() for t in tensors])
    flat = flat.to("cpu") if gloo_carries(flat) else flat  # gloo: through the host
    dist.broadcast(flat, src=0)
    if rank == 0:
        counter.on_send(flat.numel() * flat.element_size() * (world - 1))
    else:
        counter.on_recv(flat.numel() * flat.element_size())
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t).to(t.dtype))
            offset += n


def total_bytes(counter: ByteCounter) -> int:
    """All ranks' bytes sent (a bookkeeping collective, not counted itself)."""
    t = torch.tensor([counter.sent], dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return int(t.item())


@dataclass
class WorkerContext:
    """What the training loop of one worker needs besides the model."""

    job: Job
    rank: int
    world: int
    log: EventLog
    t0: float
    placement: Placement = CPU  # this rank's device, backend, threads (setup_rank)

    def reporter(self, total: int, label: str) -> StepReporter:
        """Rank 0 shows progress and evaluates; a resumed run's clock continues
        (``t0`` moved back by the checkpoint's elapsed time first)."""
        return StepReporter(self.job.config, self.log, total, label,
                            shows_progress=self.rank == 0, evaluates=self.rank == 0,
                            t0=self.t0, shards=self.world)

    def checkpointer(self, shared_rule_state: bool) -> Checkpointer:
        return Checkpointer(self.job.config, self.job.run_dir, self.rank, self.world,
                            self.log, shared_rule_state)


def open_log(job: Job, rank: int) -> EventLog:
    cfg = job.config
    tb = job.run_dir / "tensorboard" if cfg.tensorboard else None
    return EventLog(job.run_dir / "events.jsonl", rank=rank, role="worker", tensorboard_dir=tb)


# ---- the strategy --------------------------------------------------------------------

def process_main(rank: int, world: int, job: Job) -> None:
    """One worker; runs inside an initialised process group (spawn or torchrun)."""
    place = setup_rank(job.config, rank, world, DEVICE, data_bytes=train_bytes(job))
    with open_log(job, rank) as log:
        train_worker(WorkerContext(job, rank, world, log, time.perf_counter(), place))


def train_worker(ctx: WorkerContext) -> nn.Module:
    """The training loop of one worker; returns its final replica (all ranks are equal)."""
    job, rank, world = ctx.job, ctx.rank, ctx.world
    cfg = job.config
    place = ctx.placement
    model = job.build_model().to(place.torch_device)
    model.train()
    counter = ByteCounter()
    params = [p for p in model.parameters() if p.requires_grad]
    # DDP does the same: equal start even if model_fn was not seeded deterministically
    broadcast_from_rank0(params + list(model.buffers()), counter, rank, world)
    allreduce = staged(make_allreduce(cfg.allreduce, counter=counter), place.host_staging)
    comm = CommThread()
    sfb_layers = (SufficientFactors.plan(model, cfg.batch_size * cfg.grad_accum, world)
                  if cfg.sfb else [])
    sfb = SufficientFactors(sfb_layers, allreduce, world, comm)
    sfb_ids = {id(p) for p in sfb.parameters()}
    compression = Compression.from_config(cfg)  # --compress: every bucket's mean
    reducer = GradReducer([p for p in params if id(p) not in sfb_ids], allreduce, world,
                          int(cfg.bucket_mb * 2**20), comm,
                          compression if compression.active else None)
    buffers = [b for b in model.buffers() if b.is_floating_point()]

    total = total_steps(job, world)
    weights = detached(params)
    rule = make_rule(cfg, total)
    state = rule.init(weights)
    kit = WorkerKit.of(cfg, rank)
    data = DeviceData(job.train, place.torch_device, place.data_on_device,
                      kit.aug is not None)
    ckpt = ctx.checkpointer(shared_rule_state=True)  # the replicas share one rule state
    pos = ckpt.restore(model, state, kit.gen, counter) if cfg.resume else Position()
    # the checkpoint holds rank 0's (= every rank's) weights: the broadcast above already
    # ran on the fresh model, so this rank loaded them itself
    ctx.t0 -= pos.wall_s
    report = ctx.reporter(total, f"sync x{world}")
    # step times and gradient noise for a scheduler (metrics/noise.py); rank 0 measures
    probe = JobProbe(params, cfg.batch_size, cfg.grad_accum * world, world, ctx.log, rank == 0)

    step, samples, last_epoch = pos.step, pos.samples, pos.epoch
    micro = step * cfg.grad_accum
    try:
        for epoch, idx in worker_batches(job, rank, world, skip=micro):
            if step >= total:
                break  # resumed from the final checkpoint: nothing left to do
            if micro % cfg.grad_accum == 0:
                ckpt.maybe_kill(step)
            if epoch != last_epoch:
                report.maybe_eval(model, job.test, step, last_epoch, samples * world,
                                  epoch_ended=True)
                last_epoch = epoch
            if buffers and micro % cfg.grad_accum == 0:
                # as DDP's broadcast_buffers: BN statistics follow rank 0 (comm is idle here)
                broadcast_from_rank0(buffers, counter, rank, world)
            x, y = data.batch(idx, kit.aug, kit.gen)
            micro += 1
            last_micro = micro % cfg.grad_accum == 0
            probe.arm(step + 1, last_micro)
            reducer.begin(sync=last_micro)
            sfb.begin(sync=last_micro)  # before forward: its hooks are set up there
            kit.straggler.start()
            out = model(x)
            loss = kit.loss_fn(out, y)
            # averaging the micro-step gradients: each contributes 1/grad_accum
            (loss / cfg.grad_accum if cfg.grad_accum > 1 else loss).backward()
            kit.straggler.finish()
            samples += len(idx)
            # on the last micro step: waits for every bucket (and SFB gather) to be averaged
            reducer.finish()
            if not last_micro:
                continue  # only sync gradients at the last micro step
            sfb.finish()
            grads = [p.grad for p in params]
            updates, state = rule.update(grads, state, weights)
            apply_updates(weights, updates)
            for p in params:
                p.grad = None
            step += 1
            probe.step(step, reducer.stats.wait_s)
            report.step(step, epoch, loss, out, y, samples, bytes_sent=counter.sent)
            report.maybe_eval(model, job.test, step, epoch, samples * world,
                              epoch_ended=False)
            stop = step < total and preempt.agreed()  # a scheduler's SIGTERM: runtime/preempt
            if stop or ckpt.due(step, final=step == total):
                ckpt.save(model, state, Position(step, epoch, samples, 0, report.wall()),
                          kit.gen, counter)
            if stop:
                raise preempt.Preempted(step)
            if step >= total:
                break
    finally:
        probe.close()
        comm.close()
        reducer.remove()
        sfb.remove()
    report.close()
    report.maybe_eval(model, job.test, step, last_epoch, samples * world, epoch_ended=True)
    sent = total_bytes(counter)
    screened = group_screened(compression)  # every rank's skipped / clipped messages
    if rank == 0:
        stats = SyncStats(
            bytes_sent=sent, bytes_per_sample=sent / max(samples * world, 1),
            allreduce=cfg.allreduce, bytes_estimated=allreduce.estimated,
            buckets=len(reducer.buckets),
            buckets_launched_in_backward=reducer.stats.launched_in_backward,
            buckets_launched=reducer.stats.buckets_launched,
            comm_wait_s=reducer.stats.wait_s, sfb_layers=len(sfb_layers),
            compress=cfg.compress, contributions_skipped=screened.skipped,
            values_clipped=screened.values_clipped)
        write_result(job, model.state_dict(), train_samples=samples * world, steps=step,
                     stats=stats)
    return model


SPEC = StrategySpec(
    "sync", "synchronous data parallel: gradients allreduced bucket by bucket (ring, native, "
    "main)", run, process_main, world_size,
    check_resume=check_resume, can_restart=can_restart,
    supports=frozenset({"kill_worker", "compress", "powersgd"}),
    options=("bucket_mb", "sfb"), shards_by="workers", device=DEVICE,
    default_rule=workers_momentum)  # N x fewer steps per epoch: docs/data-parallel.md
