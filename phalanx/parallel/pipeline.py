"""Pipeline parallelism (GPipe, 1F1B) on ``torch.distributed.pipelining``.

The model's layers are cut into ``--stages`` balanced stages (one process each); every
batch is split into ``--microbatches`` micro-batches that flow through the stages so
several stages compute at once. GPipe runs all forwards, then all backwards (every stage
holds M micro-batches' activations); 1F1B alternates one forward and one backward once
the pipeline is full (stage s holds at most P - s). The gradients of the M micro-batches
are summed and scaled to the full batch's mean, then each stage applies the configured
rule to its own parameters: the run equals single-process training on the same batches.

:func:`train_pipeline` also runs R replicas of the pipeline (hybrid parallelism,
:mod:`phalanx.parallel.hybrid`): rank = replica * P + stage.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from phalanx.comm.staging import DeviceHop, gloo_carries
from phalanx.config import RunConfig
from phalanx.errors import ConfigError
from phalanx.models.loss import TokenCrossEntropy
from phalanx.parallel.base import (
    Job,
    detached,
    write_result,
)
from phalanx.parallel.dp_checkpoint import save_snapshot
from phalanx.parallel.instrument import StageMeter, metered_stage_class
from phalanx.parallel.loop import Hooks, Loop, Micro, Position, batch_stream
from phalanx.parallel.partition import agreed_partition, check_stages, stage_module
from phalanx.parallel.reporting import StageReporter
from phalanx.parallel.spec import StrategySpec
from phalanx.parallel.stages import (
    boundary_shapes,
    gather_model,
    refuse_batchnorm_with_microbatches,
)
from phalanx.parallel.stats import PipelineStats
from phalanx.parallel.worker import LOG_EVERY, StepReporter, WorkerKit
from phalanx.rules import apply_updates, make_rule
from phalanx.runtime.placement import DeviceSupport, setup_rank
from phalanx.runtime.supervise import PIPELINING


def schedule_class(name: str) -> type:
    """GPipe or 1F1B from ``torch.distributed.pipelining`` (imported here, on first use:
    see :func:`phalanx.parallel.instrument.metered_stage_class`)."""
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    return {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[name]

DEVICE = DeviceSupport()  # activations between neighbouring stages: NCCL-able


def world_size(cfg: RunConfig) -> int:
    return cfg.stages


def check(job: Job, stages: int, replicas: int = 1) -> None:
    """Everything about the run that can be refused before processes start."""
    cfg = job.config
    model = job.build_model()
    if stages < 2:
        raise ConfigError(f"--stages: {stages}; a pipeline needs at least 2 stages")
    check_stages(model, stages, "--stages")
    if cfg.batch_size % cfg.microbatches:
        raise ConfigError(f"--microbatches: {cfg.microbatches} does not divide --batch-size "
                          f"{cfg.batch_size} (micro-batches must be equal for equal results)")
    refuse_batchnorm_with_microbatches(model, cfg.microbatches, "--microbatches")
    if cfg.pipeline_schedule == "1f1b" and cfg.microbatches < stages:
        raise ConfigError(f"--microbatches: 1f1b needs at least --stages ({stages}) "
                          f"micro-batches to fill the pipeline, got {cfg.microbatches}")
    world = stages * replicas
    for rank in cfg.slow_workers:
        if rank >= world:
            raise ConfigError(f"--slow-workers: rank {rank} does not exist among {world} processes")
    shard = min(len(job.shard(r, replicas)) for r in range(replicas))
    if cfg.batch_size > shard:
        raise ConfigError(f"--batch-size: {cfg.batch_size} exceeds a replica's {shard} samples")


def check_job(job: Job) -> None:
    check(job, job.config.stages)


def process_main(rank: int, world: int, job: Job) -> None:
    train_pipeline(rank, world, job, job.config.stages, 1)


def _groups(stages: int, replicas: int):
    """(pipeline group per replica, data-parallel group per stage). ``new_group`` is a
    collective over the whole world: every rank creates every group, in the same order."""
    if replicas == 1:
        return [None], [None] * stages
    pipes = [dist.new_group(list(range(r * stages, (r + 1) * stages))) for r in range(replicas)]
    dps = [dist.new_group(list(range(s, stages * replicas, stages))) for s in range(stages)]
    return pipes, dps


class _StageHooks(Hooks):
    """Stage ``s`` of replica ``replica``: each step's batch goes through the GPipe / 1F1B
    schedule (which runs the micro-batches' backward itself), the stage's gradients are
    summed over the replicas, scaled to the mean and applied by the rule."""

    def __init__(self, job: Job, rank: int, world: int, stages: int, replicas: int) -> None:
        cfg = self.cfg = job.config
        if world != stages * replicas:
            raise ConfigError(f"{world} processes cannot hold {replicas} x {stages} stages")
        self.job, self.rank, self.stages, self.replicas = job, rank, stages, replicas
        self.replica, s = divmod(rank, stages)
        self.s, self.first, self.last = s, s == 0, s == stages - 1
        place = setup_rank(cfg, rank, world, DEVICE)
        self.pipes, self.dps = _groups(stages, replicas)
        self.model = model = job.build_model()
        model.train()
        mb = cfg.batch_size // cfg.microbatches
        self.part = agreed_partition(model, stages, job.train.x[:mb])
        self.shapes = boundary_shapes(model, self.part, job.train.input_shape, mb,
                                      job.train.x.dtype)
        model.to(place.torch_device)  # after the partition and the shapes were worked out
        submod = stage_module(model, self.part.names[s])
        if place.is_cuda:
            # the schedule sends host activations over gloo; the stage computes on its GPU
            submod = DeviceHop(submod, place.torch_device)
        self.kit = WorkerKit.of(cfg, self.replica, rank)  # draws per replica; slowness per rank
        self.meter = StageMeter(submod, self.kit.straggler)
        self.schedule = build_schedule(submod, self.meter, s, stages, self.shapes,
                                       job.train.input_shape, cfg.pipeline_schedule,
                                       cfg.microbatches, self.pipes[self.replica],
                                       job.train.x.dtype)
        self.shard = job.shard(self.replica, replicas)
        self.total = job.planned_steps(min(len(job.shard(r, replicas)) for r in range(replicas)))
        self.params = [p for p in submod.parameters() if p.requires_grad]
        self.weights = detached(self.params)
        self.rule = make_rule(cfg, self.total)
        self.state = self.rule.init(self.weights)
        # bytes per micro-batch: activations forward (all but the last stage), their
        # gradients backward (all but the first)
        self.per_batch = cfg.microbatches * 4 * (
            (0 if self.last else _numel(self.shapes[s]))
            + (0 if self.first else _numel(self.shapes[s - 1])))
        self.sent = 0.0
        self.report: StepReporter | None = None
        self.t_train = 0.0
        self.scale = 1.0
        self.losses: list[torch.Tensor] = []
        self.out: torch.Tensor | None = None

    def fetch(self, idx: torch.Tensor, first: bool):
        x = None
        if self.first:
            x = self.job.train.x[idx]
            if self.kit.aug is not None:
                x = self.kit.aug(x, self.kit.gen)
        return x, self.job.train.y[idx]

    def forward_backward(self, batch, scale: float, last: bool) -> Micro:
        x, y = batch
        losses: list[torch.Tensor] = []
        with self.meter.saving():
            self.out = pipeline_step(self.schedule, self.s, self.stages, x, y, losses)
        self.losses, self.y, self.scale = losses, y, scale
        self.sent += self.per_batch
        return Micro(len(y), None, self.out, y)

    def apply_update(self, step: int) -> dict:
        params, cfg = self.params, self.cfg
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        # the schedule summed its micro-batches' gradients: the mean over them and over
        # the step's accumulated batches (the loop's loss scale)
        scale = self.scale / cfg.microbatches
        if self.replicas > 1 and params:
            grads = self._sum_over_replicas(grads)
            scale /= self.replicas
        if params:
            updates, self.state = self.rule.update([g * scale for g in grads], self.state,
                                                   self.weights)
            apply_updates(self.weights, updates)
        for p in params:
            p.grad = None
        if step == 1:  # the first step connects peers and warms up: not measured
            self.t_train, self.meter.compute_s = self.report.wall(), 0.0
        if self.last and (step == 1 or step % LOG_EVERY == 0 or step == self.total):
            return self._batch_loss()
        return {}

    def _sum_over_replicas(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        # sync point: this stage's gradients summed over its replicas, one buffer
        flat = torch.cat([g.reshape(-1) for g in grads])
        host = flat.to("cpu") if gloo_carries(flat) else flat
        dist.all_reduce(host, group=self.dps[self.s])
        if host is not flat:
            flat.copy_(host)
        n = flat.numel()
        self.sent += 2 * (self.replicas - 1) / self.replicas * 4 * n  # ring-equivalent
        parts = torch.split(flat, [g.numel() for g in grads])
        return [g.view_as(p) for g, p in zip(parts, self.params)]

    def _batch_loss(self) -> dict:
        """The whole (all replicas') batch's mean loss and accuracy: a collective of the
        last stages."""
        loss = torch.stack(self.losses).mean().detach()
        acc = (self.out.argmax(-1) == self.y).float().mean()
        both = torch.stack([loss, acc])
        if self.replicas > 1:
            dist.all_reduce(both, group=self.dps[self.s])
            both /= self.replicas
        return {"loss": both[0].item(), "accuracy": both[1].item(),
                "peak_live_microbatches": self.meter.peak_live}

    def evaluate(self, report: StepReporter, step: int, epoch: int, samples: int) -> None:
        if self.replica != 0:
            return  # replicas hold the same weights: replica 0's stages are gathered
        gather_model(self.model, self.part, list(range(self.stages)), self.rank, dst=0)
        if self.rank == 0:
            report.evaluate(self.model, report.test, step, epoch, samples)

    def checkpoint(self, pos: Position, final: bool) -> None:
        every = self.cfg.checkpoint_every
        if every and pos.step % every == 0 and self.replica == 0:
            gather_model(self.model, self.part, list(range(self.stages)), self.rank, dst=0)
            if self.rank == 0:  # the model only: each stage's rule state stays with it
                save_snapshot(self.job, self.model.state_dict(), pos)


def train_pipeline(rank: int, world: int, job: Job, stages: int, replicas: int) -> None:
    cfg = job.config
    hooks = _StageHooks(job, rank, world, stages, replicas)
    label = cfg.strategy if replicas > 1 else f"pipeline-{cfg.pipeline_schedule}"
    report = hooks.report = StageReporter(job, rank, hooks.total, label,
                                          logs_loss=hooks.last and hooks.replica == 0)
    hooks.t_train = report.wall()
    batches = batch_stream(hooks.shard, cfg.batch_size, cfg.seed)
    pos = Loop(cfg, report, hooks, batches, hooks.total, shards=replicas).run()
    train_s = report.wall() - hooks.t_train
    if hooks.replica == 0:
        gather_model(hooks.model, hooks.part, list(range(stages)), rank, dst=0)
    _finish(job, hooks.model, hooks.part, rank, world, hooks.sent, pos.samples * replicas,
            pos.step, hooks.meter, train_s)


def build_schedule(submod: nn.Module, meter: StageMeter, s: int, stages: int,
                   shapes: list[tuple[int, ...]], input_shape: tuple[int, ...], name: str,
                   microbatches: int, group=None, input_dtype: torch.dtype = torch.float32):
    """Stage ``s`` of ``stages`` around ``submod`` and its GPipe / 1F1B schedule.
    ``shapes[k]`` is stage k's output for one micro-batch."""
    mb = shapes[0][0]
    stage = metered_stage_class()(
        meter, submod, s, stages, torch.device("cpu"),
        # example tensors: their requires_grad tells the stage which gradients travel
        input_args=(torch.empty(mb, *input_shape, dtype=input_dtype) if s == 0
                    else torch.empty(shapes[s - 1], requires_grad=True)),
        output_args=torch.empty(shapes[s], requires_grad=True), group=group)
    # scale_grads=False: the caller scales once per optimizer step (grad_accum-safe)
    return schedule_class(name)(stage, microbatches, loss_fn=TokenCrossEntropy(),
                           scale_grads=False)


def pipeline_step(schedule, s: int, stages: int, x: torch.Tensor | None, y: torch.Tensor,
                  losses: list) -> torch.Tensor | None:
    """One batch through the pipeline: the first stage feeds ``x``, the last computes the
    loss of each micro-batch against ``y`` (into ``losses``) and returns the outputs."""
    if s == 0:
        schedule.step(x)
        return None
    if s == stages - 1:
        return schedule.step(target=y, losses=losses)
    schedule.step()
    return None


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _finish(job, model, part, rank, world, sent, samples, step, meter, train_s) -> None:
    cfg = job.config
    traffic = torch.tensor([sent], dtype=torch.float64)
    dist.reduce(traffic, 0)
    mine = torch.tensor([meter.compute_s, train_s, meter.peak_live, meter.peak_bytes],
                        dtype=torch.float64)
    every = [torch.zeros(4, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(every, mine)
    if rank != 0:
        return
    idle = [max(0.0, 1.0 - m[0].item() / m[1].item()) if m[1] > 0 else 0.0 for m in every]
    p, m = len(part.names), cfg.microbatches
    stats = PipelineStats(
        bytes_sent=int(traffic.item()), bytes_per_sample=traffic.item() / max(samples, 1),
        stages=p, replicas=world // p, partition=[",".join(n) for n in part.names],
        partition_source=part.source, stage_costs=list(part.costs),
        microbatches=m, pipeline_schedule=cfg.pipeline_schedule,
        stage_idle_fraction=[round(v, 4) for v in idle],
        bubble_theory=(p - 1) / (m + p - 1),
        stage_peak_live_microbatches=[int(e[2].item()) for e in every],
        stage_peak_saved_bytes=[int(e[3].item()) for e in every])
    write_result(job, model.state_dict(), train_samples=samples, steps=step, stats=stats)


def stage_ranks(cfg: RunConfig) -> tuple[int, str]:
    return cfg.stages, f"--stages {cfg.stages}"


SPEC = StrategySpec(
    name="pipeline", summary="pipeline parallel: --stages stages, --microbatches per step "
    "(GPipe, 1F1B)", process_main=process_main, world_size=world_size, check_job=check_job,
    options=("microbatches", "pipeline_schedule", "stages", "split_at"), compute_ranks=stage_ranks,
    device=DEVICE, unused={"workers": "it runs one process per stage, --stages"},
    # the ranks' schedules: imported once, in the fork server
    preload=(PIPELINING,), rank_name="stage",
    example={"stages": 2, "microbatches": 2})
