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

from phalanx.comm.allreduce import AllReduce
from phalanx.comm.exchange import group_screened
from phalanx.config import RunConfig
from phalanx.errors import ConfigError
from phalanx.parallel import dp_resize
from phalanx.parallel.base import Job, write_result
from phalanx.parallel.device_data import train_bytes
from phalanx.parallel.dp_checkpoint import (
    check_checkpointing,
    check_resume,
    has_checkpoint,
)
from phalanx.parallel.loop import Micro
from phalanx.parallel.outer_step import OuterSync
from phalanx.parallel.replicas import (
    DEVICE,
    ReplicaHooks,
    WorkerContext,
    check_shards,
    open_log,
)
from phalanx.parallel.spec import StrategySpec, workers_momentum
from phalanx.parallel.stats import AveragingStats
from phalanx.rules import state_tensors
from phalanx.runtime.placement import setup_rank

__all__ = ["average_", "can_restart", "check_resume", "process_main", "train_worker",
           "world_size"]


def world_size(cfg: RunConfig) -> int:
    return cfg.workers


def check_config(cfg: RunConfig) -> None:
    if cfg.sfb:
        raise ConfigError("--sfb: sufficient factors apply to gradients; use --strategy sync")
    check_checkpointing(cfg, cfg.period)


def can_restart(cfg: RunConfig) -> bool:
    """For ``phalanx.entry.torchrun`` on a restarted attempt: is there a checkpoint to resume?"""
    return has_checkpoint(cfg)


def process_main(rank: int, world: int, job: Job) -> None:
    """One worker; runs inside an initialised process group (spawn or torchrun)."""
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


class AverageHooks(ReplicaHooks):
    """Local steps on each worker's own optimizer; every ``--period`` steps (and at the
    last) the replicas average their weights (with ``--outer-rule``: DiLoCo's outer step on
    the averaged delta)."""

    label = "average"
    shared_rule_state = False  # each worker's optimizer state is its own: per-rank checkpoints

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        self.rounds = self.start.rounds
        # --compress / --outer-rule: compressed deltas and the DiLoCo outer step
        self.outer = (OuterSync(self.cfg, self.weights, self.allreduce, self.world,
                                self.compression)
                      if OuterSync.wanted(self.cfg) else None)

    def forward_backward(self, batch: tuple[torch.Tensor, torch.Tensor], scale: float,
                         last: bool) -> Micro:
        return self.compute(batch, scale)

    def can_stop_after(self, step: int) -> bool:
        return step % self.cfg.period == 0  # replicas are equal right after a round

    def apply_update(self, step: int) -> dict:
        self.apply([p.grad for p in self.params])
        if step % self.cfg.period == 0 or step == self.total:
            self.synchronise()
            self.rounds += 1
        return {"bytes_sent": self.counter.sent, "rounds": self.rounds}

    def synchronise(self) -> None:
        # sync point: every worker blocks here until all have finished their period
        allreduce, world = self.allreduce, self.world
        if self.outer is not None:
            self.outer.sync(self.weights)
            average_(self.buffers, allreduce, world)
        else:
            average_(self.weights + self.buffers, allreduce, world)
        if self.cfg.average_optimizer_state:
            # integer leaves (step counts) are equal on every worker; average the rest
            average_([t for t in state_tensors(self.state) if t.is_floating_point()],
                     allreduce, world)


def train_worker(ctx: WorkerContext) -> nn.Module:
    """The local-SGD loop of one worker; returns the final averaged model."""
    hooks = AverageHooks(ctx)
    pos = hooks.train()
    common = hooks.run_stats(pos.samples)
    outer = hooks.outer
    screened = group_screened(outer.compression if outer is not None else None)
    if ctx.rank == 0:
        cfg = ctx.job.config
        stats = AveragingStats(
            **common, period=cfg.period, average_optimizer_state=cfg.average_optimizer_state,
            averaging_rounds=hooks.rounds, outer_rule=cfg.outer_rule,
            contributions_skipped=screened.skipped, values_clipped=screened.values_clipped)
        write_result(ctx.job, hooks.model.state_dict(), train_samples=pos.samples * ctx.world,
                     steps=pos.step, stats=stats)
    return hooks.model


def check_job(job: Job) -> None:
    check_shards(job, world_size(job.config))


SPEC = StrategySpec(
    name="average", summary="parameter averaging (local SGD) every --period steps; DiLoCo "
    "with --outer-rule", process_main=process_main, world_size=world_size, check=check_config,
    check_job=check_job, check_resume=check_resume, can_restart=can_restart,
    # bf16: the forward under autocast; the averaged weights are the fp32 masters and
    # travel in fp32 (rounding them to bf16 would drop what the masters keep)
    supports=frozenset({"kill_worker", "compress", "powersgd", "compress_checkpoint", "outer_rule",
                        "sparse_grads", "bf16"}),
    options=("allreduce", "period", "average_optimizer_state", "sfb", "outer_lr",
             "outer_momentum"),
    shards_by="workers", device=DEVICE, resize=dp_resize.RESIZE,
    default_rule=workers_momentum)  # N x fewer steps per epoch: docs/data-parallel.md
