"""Model parallelism: the model's layers cut into ``--workers`` stages, one per process.

Stage k receives the activations of stage k-1, runs its layers, sends its output on; the
last stage computes the loss, and the gradients of the activations travel back the same
way (``torch.distributed`` point-to-point). Each stage updates only its own parameters
with the configured rule, so the run equals single-process training on the same batches.
Only one stage computes at a time (no micro-batches): the pipeline strategy removes that.

``--split-layer NAME`` instead splits one ``nn.Linear`` across all workers by output
features (:mod:`phalanx.parallel.column_parallel`).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from phalanx.comm.staging import recv, send
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
from phalanx.parallel.column_parallel import check_split_layer
from phalanx.parallel.column_parallel import process_main as split_main
from phalanx.parallel.device_data import DeviceData, train_bytes
from phalanx.parallel.partition import agreed_partition, check_stages, stage_module
from phalanx.parallel.reporting import StageReporter
from phalanx.parallel.spec import StrategySpec
from phalanx.parallel.stages import boundary_shapes, gather_model
from phalanx.parallel.stats import ModelParallelStats
from phalanx.parallel.worker import WorkerKit, wants_eval
from phalanx.rules import apply_updates, make_rule
from phalanx.runtime.checkpoint import save_checkpoint
from phalanx.runtime.launch import spawn
from phalanx.runtime.placement import DeviceSupport, setup_rank, spawn_backend

DEVICE = DeviceSupport()  # activations between neighbouring ranks: NCCL-able


def world_size(cfg: RunConfig) -> int:
    return cfg.workers


def run(job: Job, log: EventLog) -> Outcome:
    cfg = job.config
    if cfg.split_layer:
        check_split_layer(job.build_model(), cfg.split_layer, cfg.workers)
    else:
        check_stages(job.build_model(), cfg.workers, "--workers")
    spawn(process_main, world_size(cfg), (job,),
          backend=spawn_backend(cfg, world_size(cfg), DEVICE))
    return read_result(job)


def process_main(rank: int, world: int, job: Job) -> None:
    if job.config.split_layer:
        return split_main(rank, world, job)
    _layer_parallel(rank, world, job)


class _Clock:
    """Seconds spent computing vs waiting for a neighbour (blocked in send/recv)."""

    def __init__(self) -> None:
        self.compute = self.wait = 0.0

    def waited(self, t: float) -> None:
        self.wait += time.perf_counter() - t

    def computed(self, t: float) -> None:
        self.compute += time.perf_counter() - t


def _layer_parallel(rank: int, world: int, job: Job) -> None:
    cfg = job.config
    place = setup_rank(cfg, rank, world, DEVICE, data_bytes=train_bytes(job))
    staging, device = place.host_staging, place.torch_device
    model = job.build_model()
    check_stages(model, world, "--workers")  # again here: under torchrun no driver checked
    model.train()
    x_all = job.train.x
    shard = job.shard(0, 1)  # one stream of batches: every stage walks the same order
    total = job.planned_steps(len(shard))
    if cfg.batch_size > len(shard):
        raise ConfigError(
            f"--batch-size: {cfg.batch_size} exceeds the {len(shard)} training samples")
    part = agreed_partition(model, world, x_all[: cfg.batch_size])
    shapes = boundary_shapes(model, part, job.train.input_shape, cfg.batch_size)
    model.to(device)  # after the partition and the shapes were worked out on the host
    stage = stage_module(model, part.names[rank])
    first, last = rank == 0, rank == world - 1
    params = [p for p in stage.parameters() if p.requires_grad]
    weights = detached(params)
    rule = make_rule(cfg, total)
    state = rule.init(weights)
    # data index 0: the single-worker loop's augmentation draws (the first stage draws)
    kit = WorkerKit.of(cfg, 0, rank)
    gen, loss_fn, straggler = kit.gen, kit.loss_fn, kit.straggler
    aug = kit.aug if first else None
    data = DeviceData(job.train, device, place.data_on_device, aug is not None)
    report = StageReporter(job, rank, total, "model-parallel", logs_loss=last)
    clock = _Clock()
    sent = 0

    step, micro, samples, epoch = 0, 0, 0, 0
    while step < total:
        for idx in epoch_batches(shard, cfg.batch_size, epoch, cfg.seed):
            # ---- forward: receive the previous stage's activations, run ours, pass on
            if first or last:
                x, y = data.batch(idx, aug, gen)
            if not first:
                x = torch.empty(shapes[rank - 1], device=device)
                t = time.perf_counter()
                recv(x, rank - 1, staging)  # sync point: blocks until stage rank-1 finished
                clock.waited(t)
                x.requires_grad_(True)
            t = time.perf_counter()
            straggler.start()
            out = stage(x)
            if last:
                loss = loss_fn(out, y)
                (loss / cfg.grad_accum).backward()
            straggler.finish()
            clock.computed(t)
            if not last:
                t = time.perf_counter()
                send(out.detach(), rank + 1, staging)
                sent += out.numel() * out.element_size()
                # ---- backward: the next stage hands back d loss / d out
                grad_out = torch.empty_like(out)
                recv(grad_out, rank + 1, staging)  # sync point: waits for all later stages
                clock.waited(t)
                t = time.perf_counter()
                straggler.start()
                if out.requires_grad:  # a first stage without parameters has nothing to do
                    out.backward(grad_out)
                straggler.finish()
                clock.computed(t)
            if not first:
                t = time.perf_counter()
                send(x.grad, rank - 1, staging)
                sent += x.grad.numel() * x.grad.element_size()
                clock.waited(t)
            micro += 1
            samples += len(idx)
            if micro % cfg.grad_accum:
                continue  # accumulate in .grad; step on the last micro-batch
            if params:  # a stage of parameter-free layers (flatten, relu) has no update
                grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
                updates, state = rule.update(grads, state, weights)
                apply_updates(weights, updates)
            for p in params:
                p.grad = None
            step += 1
            if report.wants_train(step):
                acc = (out.argmax(1) == y).float().mean().item()
                report.train(step, epoch, loss.item(), acc, samples)
            report.tick(step)
            if wants_eval(cfg, step, epoch_done=False):
                _evaluate(model, part, rank, world, report, step, epoch, samples)
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                _checkpoint(job, model, part, rank, world, step)
            if step >= total:
                break
        epoch += 1
        if wants_eval(cfg, step, epoch_done=True):
            _evaluate(model, part, rank, world, report, step, epoch, samples)
    report.close()

    gather_model(model, part, list(range(world)), rank, dst=0)
    # every rank's traffic and clocks, summed / collected on rank 0
    traffic = torch.tensor([float(sent)], dtype=torch.float64)
    dist.reduce(traffic, 0)
    clocks = torch.tensor([clock.compute, clock.wait], dtype=torch.float64)
    all_clocks = [torch.zeros(2, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(all_clocks, clocks)
    if rank == 0:
        stats = ModelParallelStats(
            bytes_sent=int(traffic.item()), bytes_per_sample=traffic.item() / max(samples, 1),
            stages=world, partition=[",".join(n) for n in part.names],
            partition_source=part.source, stage_costs=list(part.costs),
            stage_compute_s=[round(c[0].item(), 4) for c in all_clocks],
            stage_wait_s=[round(c[1].item(), 4) for c in all_clocks])
        write_result(job, model.state_dict(), train_samples=samples, steps=step, stats=stats)


def _evaluate(model, part, rank, world, report, step, epoch, samples) -> None:
    gather_model(model, part, list(range(world)), rank, dst=0)  # collective: all stages
    if rank == 0:
        report.evaluate(model, report.test, step, epoch, samples)


def _checkpoint(job: Job, model, part, rank: int, world: int, step: int) -> None:
    gather_model(model, part, list(range(world)), rank, dst=0)
    if rank == 0:
        # the model only: each stage's rule state stays with its stage
        save_checkpoint(job.run_dir / "checkpoint.pt", {"step": step, "model": {
            k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}})


SPEC = StrategySpec(
    "model-parallel", "model parallel: layers (or one layer's columns, --split-layer) over "
    "--workers ranks", run, process_main, world_size, options=("split_layer", "stages"),
    device=DEVICE)
