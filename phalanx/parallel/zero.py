"""Sharded data parallel (ZeRO, Rajbhandari et al. 2020), on our collectives.

Every worker computes a gradient on its own shard of the data, as in sync; what differs is
what each one *holds*. The model's parameters are grouped in units (:mod:`zero_units`:
the blocks, as FSDP wraps them), each a flat buffer cut into N equal shards, rank r
owning shard r:

* stage 1 shards the optimizer state: rank r keeps the rule's state (Adam's two moments)
  for its shards only. After backward each unit's gradient is reduce-scattered (rank r
  receives the sum of shard r), r updates its shard of the weights, and every unit's
  weights are all-gathered back. Gradients are held whole through backward, as in sync.
* stage 2 also shards the gradients: each unit is reduce-scattered as soon as backward has
  produced its gradients (in backward, unit by unit), and the full gradients are freed.
* stage 3 also shards the parameters: a unit's weights are all-gathered just before its
  forward, freed after it, gathered again just before its backward and freed after.

A reduce-scatter and an all-gather move X(N-1)/N bytes per rank each: stages 1 and 2 move
what the ring allreduce moves (2X(N-1)/N); stage 3 gathers twice, 1.5x that.
``--allreduce ring`` runs ours (:mod:`phalanx.comm.sharded`), ``native`` the backend's.
Clipping (``--clip-grad-norm``) takes the norm over every shard: one allreduce of a scalar.

The memory each rank holds (parameters, gradients, optimizer state) is counted from the
tensors at the end of each step's backward and reported beside the formula
(:mod:`phalanx.parallel.zero_memory`). Each rank checkpoints its own shards, and a resume
at another N re-shards them (:mod:`phalanx.parallel.zero_checkpoint`).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time

import torch
import torch.distributed as dist

from phalanx.comm.bucketing import CommThread
from phalanx.comm.counters import ByteCounter
from phalanx.comm.sharded import Sharded, make_sharded
from phalanx.config import RunConfig
from phalanx.errors import ConfigError
from phalanx.metrics.noise import JobProbe
from phalanx.parallel import zero_resize
from phalanx.parallel.base import Job, ctr_figures, write_result
from phalanx.parallel.base import evaluate as evaluate_model
from phalanx.parallel.dp_checkpoint import has_checkpoint
from phalanx.parallel.loop import Micro, Position
from phalanx.parallel.precision import precision_of
from phalanx.parallel.replicas import (
    DEVICE,
    ReplicaHooks,
    WorkerContext,
    broadcast_from_rank0,
    check_shards,
    run_replica,
)
from phalanx.parallel.spec import StrategySpec, workers_momentum
from phalanx.parallel.stats import ZeroStats
from phalanx.parallel.zero_checkpoint import ZeroCheckpointer, check_resume
from phalanx.parallel.zero_memory import Held, formula, held
from phalanx.parallel.zero_units import Unit, check_uniform, make_units
from phalanx.rules import apply_updates, make_rule, update_owned


def world_size(cfg: RunConfig) -> int:
    return cfg.workers


def process_main(rank: int, world: int, job: Job) -> None:
    """One worker; runs inside an initialised process group (spawn or torchrun)."""
    run_replica(train_worker, rank, world, job)


class TimedCollectives:
    """The run's collectives, with the time the training thread spent blocked on them: the
    step's sync time that a scheduler's throughput model is fitted to (``perf`` events).
    A collective on the communication thread (stage 2's overlapped reduce-scatters) is not
    counted: the training thread's wait for it is (:meth:`ZeroHooks._wait`)."""

    def __init__(self, inner: Sharded) -> None:
        self.inner, self.estimated, self.wait_s = inner, inner.estimated, 0.0

    def _timed(self, call, *args) -> torch.Tensor:
        if threading.current_thread() is not threading.main_thread():
            return call(*args)
        t0 = time.perf_counter()
        got = call(*args)
        self.wait_s += time.perf_counter() - t0
        return got

    def reduce_scatter(self, flat: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return self._timed(self.inner.reduce_scatter, flat, out)

    def all_gather(self, shard: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return self._timed(self.inner.all_gather, shard, out)


class ZeroHooks(ReplicaHooks):
    """One rank of sharded data parallel (see the module)."""

    label = "zero"
    shared_rule_state = False
    whole_replica = False  # the rule's state is built for the shards only (below)

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)  # the replica, started from rank 0's values
        cfg = self.cfg
        self.stage = cfg.zero_stage
        self.sharded = TimedCollectives(make_sharded(cfg.allreduce, counter=self.counter))
        # step and sync times for a scheduler (metrics/noise.py), rank 0's; no noise scale:
        # no rank holds the whole averaged gradient (the policy goes by throughput, as for
        # the parameter server)
        self.probe = JobProbe([], cfg.batch_size, cfg.grad_accum * self.world, self.world,
                              ctx.log, self.rank == 0)
        # --precision bf16: the parameters (so their gradients) and every collective in
        # bf16, the shards fp32 masters (the rule's)
        # every rank starts from rank 0's values, as DDP does (unit by unit: a flat copy of
        # the whole model would be the start-up's peak)
        broadcast_from_rank0(list(self.model.buffers()), self.counter, self.rank, self.world)
        self.units = make_units(self.model, self.params, self.rank, self.world,
                                own_shard=self.stage == 3,
                                dtype=self.precision.wire if self.precision.mixed else None,
                                start=self._from_rank0)
        # the rule sees this rank's shards only; clipping needs every shard (below)
        self.rule = make_rule(dataclasses.replace(cfg, clip_grad_norm=0.0), self.total)
        self.shards = [u.shard for u in self.units]
        self.state = self.rule.init(self.shards)
        self.grads = [torch.zeros_like(s) for s in self.shards]  # this rank's, summed
        self.held: Held | None = None
        self._unit_of = {id(p): u for u in self.units for p in u.params}
        self._index = {id(u): i for i, u in enumerate(self.units)}
        self._unit_of_module = {id(u.module): u for u in self.units if u.module is not None}
        self.zckpt = ZeroCheckpointer(cfg, ctx.job.run_dir, self.rank, self.world, ctx.log)
        if cfg.resume:  # each rank's shards of the checkpoint, re-sharded if N changed
            self.start = self.zckpt.restore(self)
            ctx.t0 -= self.start.wall_s
            if self.stage < 3:  # the replicas' whole weights (bookkeeping, not traffic)
                quiet = make_sharded("native", counter=ByteCounter())
                for u in self.units:
                    u.refresh(quiet)
        # stage 2: a unit's reduce-scatter runs on a communication thread while backward
        # goes on to the units before it (as sync's buckets; FIFO keeps every rank's
        # collectives in one order). Not stage 3: its gathers run in backward, on the
        # training thread, and two threads' collectives on one group could interleave
        # differently on different ranks
        self.comm = CommThread() if self.stage == 2 and self.world > 1 else None
        if self.stage >= 2:  # each unit is reduced as soon as backward finished it
            for u in self.units:
                u.handles += [p.register_post_accumulate_grad_hook(self._on_grad)
                              for p in u.params]
        if self.stage == 3:  # make_units freed the buffers: the rank holds its shards
            for u in self.units:
                if u.module is not None:
                    u.handles += [u.module.register_forward_pre_hook(self._before_forward),
                                  u.module.register_forward_hook(self._after_forward)]

    def _from_rank0(self, values: torch.Tensor) -> None:
        broadcast_from_rank0([values], self.counter, self.rank, self.world)

    # ---- stage 3: gather before use, free after ----------------------------------------

    def restore(self) -> Position:
        return Position()  # the shards exist once the units are built: __init__ restores

    def _before_forward(self, module, args) -> None:
        self._unit_for(module).gather(self.sharded)

    def _after_forward(self, module, args, out) -> None:
        unit = self._unit_for(module)
        unit.free()
        if not torch.is_grad_enabled():
            return  # an evaluation: no backward comes; the next forward gathers again

        def regather(grad: torch.Tensor) -> None:  # just before this unit's backward
            unit.gather(self.sharded)

        outs = out if isinstance(out, tuple) else (out,)
        for t in outs:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(regather)

    def _unit_for(self, module) -> Unit:
        return self._unit_of_module[id(module)]

    # ---- the step --------------------------------------------------------------------

    def before_step(self, step: int) -> None:
        super().before_step(step)
        if self.buffers:  # as DDP's broadcast_buffers: BN statistics follow rank 0
            broadcast_from_rank0(self.buffers, self.counter, self.rank, self.world)

    def forward_backward(self, batch, scale: float, last: bool) -> Micro:
        for u in self.units:
            u.pending, u.reduced = len(u.params), False
            if u.module is None:
                u.gather(self.sharded)  # the root: embeddings, head (stage 3)
        micro = self.compute(batch, scale)
        if self.stage >= 2:
            for u in reversed(self.units):  # never reached by backward: zeros, in order
                if not u.reduced:
                    self._reduce(u)
        if last:
            self._wait()
            self.held = held(self)  # everything a step holds, before the update
        return micro

    def _on_grad(self, p: torch.Tensor) -> None:
        # runs inside autograd, right after p.grad is final for this backward
        unit = self._unit_of[id(p)]
        unit.pending -= 1
        if unit.pending == 0:
            self._reduce(unit)

    def _reduce(self, unit: Unit) -> None:
        """Reduce-scatter ``unit``'s gradients into this rank's summed shard; free them
        (stage 3: the weights too)."""
        i = self._index[id(unit)]
        flat = unit.flat_grad()  # a tensor of its own: what the reduce-scatter reads
        for p in unit.params:
            p.grad = None
        unit.reduced = True
        if self.stage == 3:
            unit.free()
        if self.comm is not None:
            self.comm.submit(functools.partial(self._reduce_into, i, flat))
        else:
            self._reduce_into(i, flat)

    def _reduce_into(self, i: int, flat: torch.Tensor) -> None:
        got = torch.empty(self.grads[i].shape, dtype=flat.dtype,  # the wire's dtype
                          device=self.grads[i].device)
        self.sharded.reduce_scatter(flat, got)
        self.grads[i] += got  # summed in fp32 over the micro-batches

    def _wait(self) -> None:
        """Stage 2: every reduce-scatter handed to the communication thread is done."""
        if self.comm is not None:
            t0 = time.perf_counter()
            self.comm.wait()  # sync point: this rank's summed shards are complete
            self.sharded.wait_s += time.perf_counter() - t0

    def apply_update(self, step: int) -> dict:
        self._wait()
        if self.stage == 1:  # the step's gradients, held whole until now
            for u in self.units:
                self._reduce(u)
        grads = [g.div_(self.world) for g in self.grads]  # the mean over the workers
        if self.cfg.clip_grad_norm:
            self._clip(grads)
        updates, self.state = update_owned(self.rule, grads, self.state, self.shards)
        apply_updates(self.shards, updates)
        for g in self.grads:
            g.zero_()
        if self.stage < 3:  # every rank's updated shards, into every replica
            for u in self.units:
                u.refresh(self.sharded)
        self.probe.step(step, self.sharded.wait_s)
        return {"bytes_sent": self.counter.sent}

    def _clip(self, grads: list[torch.Tensor]) -> None:
        """``clip_grad_norm_``'s formula over the whole gradient: each rank's share of the
        squared norm, summed by one allreduce of a scalar."""
        sq = torch.stack([g.double().square().sum() for g in grads]).sum().reshape(1)
        if self.world > 1:
            dist.all_reduce(sq)  # sync point: every rank's shards
            self.counter.on_send(sq.numel() * sq.element_size() * (self.world - 1))
        coef = torch.clamp(self.cfg.clip_grad_norm / (sq.sqrt() + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))

    # ---- what needs the whole model ---------------------------------------------------

    def gather_all(self) -> None:
        for u in self.units:
            u.gather(self.sharded)

    def master_state(self) -> dict[str, torch.Tensor]:
        """The model's state with every parameter's fp32 master values (a collective:
        every rank gathers every unit's shards; bookkeeping, not counted as traffic).
        Under fp32 these are the parameters' own values."""
        state = self.model.state_dict()
        if not self.precision.mixed:
            return state
        names: dict[int, list[str]] = {}
        for name, p in self.model.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(name)
        quiet = make_sharded("native", counter=ByteCounter())
        for u in self.units:
            whole = torch.empty(u.layout.padded, dtype=u.shard.dtype, device=u.shard.device)
            quiet.all_gather(u.shard, whole)
            offset = 0
            for p in u.params:
                n = p.numel()
                for name in names[id(p)]:
                    state[name] = whole[offset : offset + n].view(p.shape)
                offset += n
        return state

    def evaluate(self, report, step: int, epoch: int, samples: int) -> None:
        if self.stage < 3 or self.test is None:  # every rank holds the whole weights
            super().evaluate(report, step, epoch, samples)
            return
        # stage 3: unit by unit, as training's forward (each block's unit gathered by its
        # pre-hook, freed after its forward), so no rank holds the whole model. Each
        # gather is a collective: every rank runs the evaluation's forwards, rank 0 scores
        roots = [u for u in self.units if u.module is None]
        for u in roots:  # the embeddings, the head: used first and last
            u.gather(self.sharded)
        if report.evaluates:
            report.evaluate(self.model, self.test, step, epoch, samples)
        else:
            _evaluation_forwards(self.model, self.test, self.cfg)
        for u in roots:
            u.free()

    def checkpoint(self, pos: Position, final: bool) -> None:
        self.zckpt.save(self, pos)  # each rank its shards (zero_checkpoint.py)

    def close(self) -> None:
        self.probe.close()
        if self.comm is not None:
            self.comm.close()
        for u in self.units:
            for h in u.handles:
                h.remove()


def _evaluation_forwards(model, test, cfg: RunConfig) -> None:
    """The forwards ``StepReporter.evaluate`` runs (parallel/worker.py), for a rank that
    does not score: stage 3's gathers in them are collectives every rank must join, in the
    same order (a forward added there must be added here)."""
    evaluate_model(model, test, precision=precision_of(cfg))
    ctr_figures(model, test)


def train_worker(ctx: WorkerContext) -> None:
    hooks = ZeroHooks(ctx)
    try:
        pos = hooks.train()
        # training is over: the rule's state and the gradient shards go before the whole
        # model is gathered (the run's last peak)
        hooks.state, hooks.grads = None, []
        hooks.gather_all()  # the whole model, for rank 0's result
        state = hooks.master_state()
    finally:
        hooks.close()
    common = {**hooks.run_stats(pos.samples), "bytes_estimated": hooks.sharded.estimated}
    memory = hooks.held.gathered() if hooks.held is not None else {}
    if ctx.rank == 0:
        cfg = ctx.job.config
        stats = ZeroStats(
            **common, zero_stage=hooks.stage, units=len(hooks.units),
            **memory, **formula(cfg, hooks), memory_convention=CONVENTION[hooks.precision.name])
        write_result(ctx.job, state, train_samples=pos.samples * ctx.world,
                     steps=pos.step, stats=stats)


CONVENTION = {
    "fp32": "fp32 parameters (4 B), gradients (4 B) and the rule's state (K B per parameter: "
            "Adam 8, momentum 4, SGD 0), counted at the end of backward; sharded parts over "
            "N, each unit padded to a multiple of N",
    "bf16": "bf16 parameters (2 B) and gradients (2 B), fp32 master shards (4 B / N), an "
            "fp32 summed gradient shard (4 B / N) and the rule's state (K B / N), counted at "
            "the end of backward; each unit padded to a multiple of N"}


def check_config(cfg: RunConfig) -> None:
    if cfg.allreduce == "main":
        raise ConfigError("--allreduce main: sharded data parallel reduce-scatters and "
                          "all-gathers; use ring (ours) or native (the backend's)")


def check_job(job: Job) -> None:
    check_shards(job, world_size(job.config))
    model = job.build_model()
    why = check_uniform([p for p in model.parameters() if p.requires_grad])
    if why:
        raise ConfigError(f"--model {job.config.model}: zero cannot shard it: {why}")


SPEC = StrategySpec(
    name="zero", summary="sharded data parallel (ZeRO): optimizer state (stage 1), gradients "
    "(2), parameters (3) sharded over the workers", process_main=process_main,
    world_size=world_size, check=check_config, check_job=check_job,
    options=("allreduce", "zero_stage", "split_at"), shards_by="workers", device=DEVICE,
    supports=frozenset({"bf16", "kill_worker"}),
    check_resume=check_resume, can_restart=has_checkpoint, reshards=True,
    resize=zero_resize.RESIZE,
    example={"zero_stage": 3}, default_rule=workers_momentum)
