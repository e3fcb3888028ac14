"""torch's FSDP2 (``torch.distributed.fsdp.fully_shard``) on the same models and rules: the
reference implementation of sharded data parallel that users pick, beside ours
(:mod:`phalanx.parallel.zero`).

Each unit (:func:`~phalanx.parallel.zero_units.unit_modules`: the model's blocks) and then
the model itself are wrapped with ``fully_shard``: every parameter becomes a DTensor
sharded on its first dimension, gathered before each unit's forward and backward and
reduce-scattered (averaged) after its backward, by FSDP2's own hooks on the backend's
collectives. The update is ours: the run's rule on each rank's local shards
(``to_local()``, updated in place), so FSDP2 and ZeRO-3 differ only in how they shard and
communicate. Clipping takes the norm over every shard (one allreduce of a scalar).

It runs on gloo and the CPU in torch 2.13 (checked: a two-rank ``fully_shard`` loop
trains here) and on NCCL with one GPU per rank. The backends report no bytes: the summary
counts FSDP2's default schedule by the formula, ``bytes_estimated: true``: per step, each
unit's weights all-gathered in forward and again in backward and its gradients
reduce-scattered, the root's gathered once (FSDP2 does not reshard the root after forward),
each collective X(N-1)/N per rank over dim-0-padded shards.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.distributed as dist

from phalanx.config import RunConfig
from phalanx.parallel.base import Job, write_result
from phalanx.parallel.loop import Micro
from phalanx.parallel.replicas import (
    DEVICE,
    ReplicaHooks,
    WorkerContext,
    broadcast_from_rank0,
    check_shards,
    run_replica,
)
from phalanx.parallel.spec import StrategySpec, workers_momentum
from phalanx.parallel.stats import SyncStats
from phalanx.parallel.zero_units import unit_modules
from phalanx.rules import apply_updates, make_rule, update_owned


def world_size(cfg: RunConfig) -> int:
    return cfg.workers


def process_main(rank: int, world: int, job: Job) -> None:
    """One worker; runs inside an initialised process group (spawn or torchrun)."""
    run_replica(train_worker, rank, world, job)


def _padded_bytes(p: torch.Tensor, world: int, dtype: torch.dtype) -> int:
    """A parameter's bytes in ``dtype`` as FSDP2 shards it: dim 0 padded to a multiple of
    N."""
    rows = p.shape[0] if p.dim() else 1
    size = torch.empty((), dtype=dtype).element_size()
    return math.ceil(rows / world) * world * (p.numel() // max(rows, 1)) * size


class FsdpHooks(ReplicaHooks):
    """One rank of FSDP2 (see the module)."""

    label = "fsdp"
    shared_rule_state = False
    whole_replica = False  # the rule's state is built for the local shards only (below)

    def __init__(self, ctx: WorkerContext) -> None:
        # here, not at the top: the registry imports every strategy, and FSDP2's package
        # costs ~0.7 s of every `phalanx` command and fork server (the spec's preload
        # gives an fsdp run's fork server it)
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        super().__init__(ctx)  # the replica
        units = unit_modules(self.model)
        # every rank starts from rank 0's values, as DDP does, unit by unit (a flat copy of
        # the whole model would be the start-up's peak)
        left = {id(p) for p in self.params}
        for module in [m for _, m in units] + [self.model]:  # the model last: the root's
            group = [p for p in module.parameters() if id(p) in left]
            broadcast_from_rank0(group, self.counter, self.rank, self.world)
            left -= {id(p) for p in group}
        broadcast_from_rank0(list(self.model.buffers()), self.counter, self.rank, self.world)
        # the per-step traffic of FSDP2's default schedule (see the module), in the wire's
        # dtype (--precision bf16: FSDP2 gathers and reduce-scatters bf16)
        wire = self.precision.wire
        in_units = {id(p) for _, m in units for p in m.parameters()}
        share = (self.world - 1) / self.world
        self.step_bytes = int(share * sum(
            _padded_bytes(p, self.world, wire) * (3 if id(p) in in_units else 2)
            for p in self.params))
        mesh = None  # the default group, on the rank's device type
        # bf16: FSDP2's own mixed precision (bf16 gathered weights and reduced gradients,
        # fp32 sharded masters); fp32: its default policy
        policy = (MixedPrecisionPolicy(param_dtype=wire, reduce_dtype=wire)
                  if self.precision.mixed else MixedPrecisionPolicy())
        for _, module in units:
            fully_shard(module, mesh=mesh, mp_policy=policy)
        fully_shard(self.model, mesh=mesh, mp_policy=policy)
        self.params = [p for p in self.model.parameters() if p.requires_grad]  # DTensors
        self.locals = [p.to_local() for p in self.params]  # this rank's shards, in place
        self.weights = []
        self.rule = make_rule(dataclasses.replace(self.cfg, clip_grad_norm=0.0), self.total)
        self.state = self.rule.init(self.locals)
        self.units = len(units) + 1

    def before_step(self, step: int) -> None:
        super().before_step(step)
        if self.buffers:  # as DDP's broadcast_buffers: BN statistics follow rank 0
            broadcast_from_rank0(self.buffers, self.counter, self.rank, self.world)

    def forward_backward(self, batch, scale: float, last: bool) -> Micro:
        # only the step's last micro-batch reduce-scatters (FSDP2's no_sync)
        self.model.set_requires_gradient_sync(last)
        return self.compute(batch, scale)

    def apply_update(self, step: int) -> dict:
        grads = [p.grad.to_local() if p.grad is not None else torch.zeros_like(w)
                 for p, w in zip(self.params, self.locals)]
        if self.cfg.clip_grad_norm:
            sq = torch.stack([g.double().square().sum() for g in grads]).sum().reshape(1)
            dist.all_reduce(sq)  # sync point: every rank's shards
            coef = torch.clamp(self.cfg.clip_grad_norm / (sq.sqrt() + 1e-6), max=1.0)
            grads = [g * coef.to(g.dtype) for g in grads]
        with torch.no_grad():
            updates, self.state = update_owned(self.rule, grads, self.state, self.locals)
            apply_updates(self.locals, updates)
        for p in self.params:
            p.grad = None
        self.counter.on_send(self.step_bytes)  # FSDP2's collectives, by the formula
        return {"bytes_sent": self.counter.sent}

    def full_state(self) -> dict[str, torch.Tensor]:
        """The whole model's state (a collective: every rank gathers every DTensor)."""
        return {k: v.full_tensor() if hasattr(v, "full_tensor") else v
                for k, v in self.model.state_dict().items()}

    def evaluate(self, report, step: int, epoch: int, samples: int) -> None:
        state = self.full_state()  # every rank takes part; rank 0 scores a plain replica
        if report.evaluates and self.test is not None:
            model = self.job.build_model().to(self.ctx.placement.torch_device)
            model.load_state_dict(state)
            report.evaluate(model, self.test, step, epoch, samples)

    def checkpoint(self, pos, final: bool) -> None:
        pass  # the spec refuses --checkpoint-every: each rank's state is its own shard

    def can_stop_after(self, step: int) -> bool:
        return False


def train_worker(ctx: WorkerContext) -> None:
    hooks = FsdpHooks(ctx)
    pos = hooks.train()
    state = hooks.full_state()
    stats = SyncStats(**{**hooks.run_stats(pos.samples), "bytes_estimated": True},
                      buckets=hooks.units)
    if ctx.rank == 0:
        write_result(ctx.job, state, train_samples=pos.samples * ctx.world, steps=pos.step,
                     stats=stats)


def check_job(job: Job) -> None:
    check_shards(job, world_size(job.config))


SPEC = StrategySpec(
    name="fsdp", summary="torch's FSDP2 (fully_shard) on the model's blocks, with phalanx's "
    "rule on each rank's shards: the reference for --strategy zero",
    process_main=process_main, world_size=world_size, check_job=check_job,
    preload=("torch.distributed.fsdp",), shards_by="workers", device=DEVICE,
    options=("split_at",),
    supports=frozenset({"bf16"}),
    unused={"checkpoint_every": "each rank's optimizer state is its own shard: fsdp does "
            "not checkpoint it yet"},
    default_rule=workers_momentum)
