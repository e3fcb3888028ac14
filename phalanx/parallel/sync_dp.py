"""Synchronous data parallel: every worker computes a gradient on its own shard, the
gradients are averaged with an allreduce (ring, native or main-node) bucket by bucket
while backward runs, and every worker applies the same update rule to the same average —
so the replicas stay identical without ever exchanging parameters after the start.

``--sparse-allreduce`` (a model with a sparse-gradient table, ``--model ctr``): the table
is left out of the buckets and its gradient goes as the rows the step touched — gloo's
sparse allreduce, an allgather of every rank's (row ids, rows) — instead of the whole
table densified; every replica then updates those rows only (:mod:`phalanx.rules.sparse`).

``--sfb`` sends sufficient factors instead of the weight gradient of the fully connected
layers where that is smaller (see :mod:`phalanx.comm.sfb`).

Faults (:mod:`phalanx.parallel.dp_checkpoint`): checkpoints every ``--checkpoint-every``
steps, ``--resume DIR`` / a torchrun restart continues the same trajectory, and
``--kill-worker RANK@STEP`` crashes a worker.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from phalanx.comm.bucketing import CommThread, GradReducer
from phalanx.comm.exchange import group_screened
from phalanx.comm.sfb import SufficientFactors
from phalanx.config import RunConfig
from phalanx.errors import ConfigError
from phalanx.metrics.noise import JobProbe
from phalanx.parallel import dp_resize
from phalanx.parallel.base import Job, write_result
from phalanx.parallel.device_data import train_bytes
from phalanx.parallel.dp_checkpoint import check_resume as _check_resume
from phalanx.parallel.dp_checkpoint import has_checkpoint
from phalanx.parallel.loop import Micro
from phalanx.parallel.replicas import (
    DEVICE,
    ReplicaHooks,
    WorkerContext,
    broadcast_from_rank0,
    check_shards,
    open_log,
)
from phalanx.parallel.spec import StrategySpec, workers_momentum
from phalanx.parallel.stats import SyncStats
from phalanx.rules.sparse import sparse_table
from phalanx.runtime.placement import setup_rank


def world_size(cfg: RunConfig) -> int:
    return cfg.workers


def check_resume(cfg: RunConfig) -> None:
    """``--resume DIR``: DIR's checkpoint exists, is intact and belongs to this run."""
    _check_resume(cfg)


def can_restart(cfg: RunConfig) -> bool:
    """For ``phalanx.entry.torchrun`` on a restarted attempt: is there a checkpoint to resume?"""
    return has_checkpoint(cfg)


def process_main(rank: int, world: int, job: Job) -> None:
    """One worker; runs inside an initialised process group (spawn or torchrun)."""
    place = setup_rank(job.config, rank, world, DEVICE, data_bytes=train_bytes(job))
    with open_log(job, rank) as log:
        train_worker(WorkerContext(job, rank, world, log, time.perf_counter(), place))


class SyncHooks(ReplicaHooks):
    """Backward overlapped with the bucketed allreduce (and SFB's factor gathers); every
    replica applies the same rule to the same mean gradient."""

    label = "sync"
    shared_rule_state = True  # the replicas share one rule state

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        cfg, world = self.cfg, self.world
        self.comm = CommThread()
        self.sfb_layers = (SufficientFactors.plan(self.model, cfg.batch_size * cfg.grad_accum,
                                                  world) if cfg.sfb else [])
        self.sfb = SufficientFactors(self.sfb_layers, self.allreduce, world, self.comm)
        sfb_ids = {id(p) for p in self.sfb.parameters()}
        # --sparse-allreduce: the table's rows go on their own, after backward
        self.sparse = self.params[self.table] if cfg.sparse_allreduce else None
        if self.sparse is not None:
            sfb_ids.add(id(self.sparse))
        self.reducer = GradReducer([p for p in self.params if id(p) not in sfb_ids],
                                   self.allreduce, world, int(cfg.bucket_mb * 2**20),
                                   self.comm,
                                   self.compression if self.compression.active else None,
                                   wire=self.precision.wire)
        # step times and gradient noise for a scheduler (metrics/noise.py); rank 0 measures
        self.probe = JobProbe(self.params, cfg.batch_size, cfg.grad_accum * world, world,
                              ctx.log, self.rank == 0)
        self.next_step = 1

    def before_step(self, step: int) -> None:
        super().before_step(step)
        self.next_step = step + 1
        if self.buffers:
            # as DDP's broadcast_buffers: BN statistics follow rank 0 (comm is idle here)
            broadcast_from_rank0(self.buffers, self.counter, self.rank, self.world)

    def forward_backward(self, batch: tuple[torch.Tensor, torch.Tensor], scale: float,
                         last: bool) -> Micro:
        # only the step's last micro-batch syncs its gradients (DDP's no_sync before it)
        self.probe.arm(self.next_step, last)
        self.reducer.begin(sync=last)
        self.sfb.begin(sync=last)  # before forward: its hooks are set up there
        return self.compute(batch, scale)

    def apply_update(self, step: int) -> dict:
        self.reducer.finish()  # sync point: waits for every bucket to be averaged
        self.sfb.finish()
        if self.sparse is not None:
            self.sparse_mean(self.sparse)
        self.probe.step(step, self.reducer.stats.wait_s)  # .grad: the averaged gradient
        self.apply([p.grad for p in self.params])
        return {"bytes_sent": self.counter.sent}

    def sparse_mean(self, table: torch.Tensor) -> None:
        """The mean of every replica's sparse table gradient, rows only. gloo's sparse
        allreduce allgathers each rank's (ids, rows); a rank's bytes sent are counted as
        what it hands the others: its own ids and rows, to each of the world - 1 peers (the
        same total as a ring allgather's; received bytes are not counted here)."""
        g = table.grad.coalesce().cpu()  # gloo: through the host
        mine = g.indices().numel() * 8 + g.values().numel() * g.values().element_size()
        if self.world > 1:
            dist.all_reduce(g)  # sync point: every replica's rows
            self.counter.on_send((self.world - 1) * mine)
        table.grad = (g.coalesce() / self.world).to(table.device)

    def close(self) -> None:
        self.probe.close()
        self.comm.close()
        self.reducer.remove()
        self.sfb.remove()


def train_worker(ctx: WorkerContext) -> nn.Module:
    """The training loop of one worker; returns its final replica (all ranks are equal)."""
    hooks = SyncHooks(ctx)
    try:
        pos = hooks.train()
    finally:
        hooks.close()
    common = hooks.run_stats(pos.samples)
    screened = group_screened(hooks.compression)  # every rank's skipped / clipped messages
    if ctx.rank == 0:
        r = hooks.reducer
        stats = SyncStats(
            **common, buckets=len(r.buckets),
            buckets_launched_in_backward=r.stats.launched_in_backward,
            buckets_launched=r.stats.buckets_launched, comm_wait_s=r.stats.wait_s,
            sfb_layers=len(hooks.sfb_layers), contributions_skipped=screened.skipped,
            values_clipped=screened.values_clipped)
        write_result(ctx.job, hooks.model.state_dict(), train_samples=pos.samples * ctx.world,
                     steps=pos.step, stats=stats)
    return hooks.model


def check_config(cfg: RunConfig) -> None:
    if cfg.precision != "fp32" and (cfg.compress != "none" or cfg.sfb):
        flag = "--compress" if cfg.compress != "none" else "--sfb"
        raise ConfigError(f"{flag}: not with --precision {cfg.precision} (its gradients "
                          "already travel in bf16; choose one)")


def check_job(job: Job) -> None:
    check_shards(job, world_size(job.config))
    if job.config.sparse_allreduce:
        model = job.build_model()
        if sparse_table(model, [p for p in model.parameters() if p.requires_grad]) is None:
            raise ConfigError("--sparse-allreduce: the model has no embedding table with "
                              "sparse gradients (--model ctr has one); drop it")


SPEC = StrategySpec(
    name="sync", summary="synchronous data parallel: gradients allreduced bucket by bucket "
    "(ring, native, main)", process_main=process_main, world_size=world_size,
    check=check_config, check_job=check_job, check_resume=check_resume,
    can_restart=can_restart,
    supports=frozenset({"kill_worker", "compress", "powersgd", "compress_checkpoint",
                        "sparse_grads", "bf16"}),
    options=("allreduce", "bucket_mb", "sfb", "sparse_allreduce"), shards_by="workers",
    device=DEVICE, resize=dp_resize.RESIZE,
    default_rule=workers_momentum)  # N x fewer steps per epoch: docs/data-parallel.md
