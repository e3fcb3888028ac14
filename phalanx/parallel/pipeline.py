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
from phalanx.data import epoch_batches
from phalanx.errors import ConfigError
from phalanx.metrics import EventLog
from phalanx.parallel.base import (
    Job,
    Outcome,
    detached,
    read_result,
    write_result,
)
from phalanx.parallel.instrument import StageMeter, metered_stage_class
from phalanx.parallel.partition import agreed_partition, check_stages, stage_module
from phalanx.parallel.reporting import StageReporter
from phalanx.parallel.spec import StrategySpec
from phalanx.parallel.stages import (
    boundary_shapes,
    gather_model,
    refuse_batchnorm_with_microbatches,
)
from phalanx.parallel.stats import PipelineStats
from phalanx.parallel.worker import WorkerKit, wants_eval
from phalanx.rules import apply_updates, make_rule
from phalanx.runtime.checkpoint import save_checkpoint
from phalanx.runtime.launch import spawn
from phalanx.runtime.placement import DeviceSupport, setup_rank, spawn_backend
from phalanx.runtime.supervise import PIPELINING, preload


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


def run(job: Job, log: EventLog) -> Outcome:
    check(job, job.config.stages)
    preload(PIPELINING)  # the ranks' schedules: imported once, in the fork server
    spawn(process_main, world_size(job.config), (job,),
          backend=spawn_backend(job.config, world_size(job.config), DEVICE),
          name=lambda rank: f"stage {rank}")
    return read_result(job)


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


def train_pipeline(rank: int, world: int, job: Job, stages: int, replicas: int) -> None:
    cfg = job.config
    if world != stages * replicas:
        raise ConfigError(f"{world} processes cannot hold {replicas} x {stages} stages")
    check(job, stages, replicas)  # again here: under torchrun no driver checked first
    replica, s = divmod(rank, stages)
    first, last = s == 0, s == stages - 1
    place = setup_rank(cfg, rank, world, DEVICE)
    pipes, dps = _groups(stages, replicas)
    model = job.build_model()
    model.train()
    x_all, y_all = job.train.x, job.train.y
    mb = cfg.batch_size // cfg.microbatches
    part = agreed_partition(model, stages, x_all[:mb])
    shapes = boundary_shapes(model, part, job.train.input_shape, mb)
    model.to(place.torch_device)  # after the partition and the shapes were worked out
    submod = stage_module(model, part.names[s])
    if place.is_cuda:
        # the schedule sends host activations over gloo; the stage computes on its GPU
        submod = DeviceHop(submod, place.torch_device)
    kit = WorkerKit.of(cfg, replica, rank)  # draws per replica; slowness per rank
    meter = StageMeter(submod, kit.straggler)
    schedule = build_schedule(submod, meter, s, stages, shapes, job.train.input_shape,
                              cfg.pipeline_schedule, cfg.microbatches, pipes[replica])
    shard = job.shard(replica, replicas)
    total = job.planned_steps(min(len(job.shard(r, replicas)) for r in range(replicas)))
    params = [p for p in submod.parameters() if p.requires_grad]
    weights = detached(params)
    rule = make_rule(cfg, total)
    state = rule.init(weights)
    aug, gen = (kit.aug if first else None), kit.gen
    label = cfg.strategy if replicas > 1 else f"pipeline-{cfg.pipeline_schedule}"
    report = StageReporter(job, rank, total, label, logs_loss=last and replica == 0)
    # bytes per micro-batch: activations forward (all but the last stage), their
    # gradients backward (all but the first)
    per_batch = cfg.microbatches * 4 * (
        (0 if last else _numel(shapes[s])) + (0 if first else _numel(shapes[s - 1])))
    flat_params = sum(p.numel() for p in params)
    sent, step, micro, samples, epoch = 0.0, 0, 0, 0, 0
    t_train = report.wall()
    while step < total:
        for idx in epoch_batches(shard, cfg.batch_size, epoch, cfg.seed):
            losses: list[torch.Tensor] = []
            with meter.saving():
                x = x_all[idx] if first else None
                if aug is not None:
                    x = aug(x, gen)
                out = pipeline_step(schedule, s, stages, x, y_all[idx], losses)
            sent += per_batch
            micro += 1
            samples += len(idx) * replicas
            if micro % cfg.grad_accum:
                continue
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            scale = 1.0 / (cfg.microbatches * cfg.grad_accum)
            if replicas > 1 and params:
                # sync point: this stage's gradients summed over its replicas, one buffer
                flat = torch.cat([g.reshape(-1) for g in grads])
                host = flat.to("cpu") if gloo_carries(flat) else flat
                dist.all_reduce(host, group=dps[s])
                if host is not flat:
                    flat.copy_(host)
                sent += 2 * (replicas - 1) / replicas * 4 * flat_params  # ring-equivalent
                grads = list(torch.split(flat, [g.numel() for g in grads]))
                grads = [g.view_as(p) for g, p in zip(grads, params)]
                scale /= replicas
            if params:
                updates, state = rule.update([g * scale for g in grads], state, weights)
                apply_updates(weights, updates)
            for p in params:
                p.grad = None
            step += 1
            if step == 1:  # the first step connects peers and warms up: not measured
                t_train, meter.compute_s = report.wall(), 0.0
            if last and (step == 1 or step % 10 == 0 or step == total):
                loss = torch.stack(losses).mean().detach()
                acc = (out.argmax(1) == y_all[idx]).float().mean()
                both = torch.stack([loss, acc])
                if replicas > 1:  # the whole (all replicas') batch's mean loss
                    dist.all_reduce(both, group=dps[s])
                    both /= replicas
                if report.wants_train(step):
                    # this replica's own samples (events' convention: per rank)
                    report.train(step, epoch, both[0].item(), both[1].item(),
                                 samples // replicas,
                                 peak_live_microbatches=meter.peak_live)
            report.tick(step)
            if wants_eval(cfg, step, epoch_done=False):
                _evaluate(model, part, rank, stages, replica, report, step, epoch, samples)
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and replica == 0:
                gather_model(model, part, list(range(stages)), rank, dst=0)
                if rank == 0:  # the model only: each stage's rule state stays with it
                    save_checkpoint(job.run_dir / "checkpoint.pt", {"step": step, "model": {
                        k: v.detach().to("cpu", copy=True)
                        for k, v in model.state_dict().items()}})
            if step >= total:
                break
        epoch += 1
        if wants_eval(cfg, step, epoch_done=True):
            _evaluate(model, part, rank, stages, replica, report, step, epoch, samples)
    train_s = report.wall() - t_train
    report.close()
    if replica == 0:
        gather_model(model, part, list(range(stages)), rank, dst=0)
    _finish(job, model, part, rank, world, sent, samples, step, meter, train_s)


def build_schedule(submod: nn.Module, meter: StageMeter, s: int, stages: int,
                   shapes: list[tuple[int, ...]], input_shape: tuple[int, ...], name: str,
                   microbatches: int, group=None):
    """Stage ``s`` of ``stages`` around ``submod`` and its GPipe / 1F1B schedule.
    ``shapes[k]`` is stage k's output for one micro-batch."""
    mb = shapes[0][0]
    stage = metered_stage_class()(
        meter, submod, s, stages, torch.device("cpu"),
        # example tensors: their requires_grad tells the stage which gradients travel
        input_args=(torch.empty(mb, *input_shape) if s == 0
                    else torch.empty(shapes[s - 1], requires_grad=True)),
        output_args=torch.empty(shapes[s], requires_grad=True), group=group)
    # scale_grads=False: the caller scales once per optimizer step (grad_accum-safe)
    return schedule_class(name)(stage, microbatches, loss_fn=nn.CrossEntropyLoss(),
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


def _evaluate(model, part, rank, stages, replica, report, step, epoch, samples) -> None:
    if replica != 0:
        return  # replicas hold the same weights: replica 0's stages are gathered
    gather_model(model, part, list(range(stages)), rank, dst=0)
    if rank == 0:
        report.evaluate(model, report.test, step, epoch, samples)


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
        stages=p, partition=[",".join(n) for n in part.names],
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
    "pipeline", "pipeline parallel: --stages stages, --microbatches per step (GPipe, 1F1B)",
    run, process_main, world_size, options=("microbatches", "pipeline_schedule", "stages"),
    compute_ranks=stage_ranks, device=DEVICE,
    example={"stages": 2, "microbatches": 2})
