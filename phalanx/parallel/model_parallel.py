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
from phalanx.errors import ConfigError
from phalanx.parallel.base import (
    Job,
    detached,
    write_result,
)
from phalanx.parallel.column_parallel import check_split_layer
from phalanx.parallel.column_parallel import process_main as split_main
from phalanx.parallel.device_data import DeviceData, train_bytes
from phalanx.parallel.dp_checkpoint import save_snapshot
from phalanx.parallel.loop import Hooks, Loop, Micro, Position, batch_stream
from phalanx.parallel.partition import agreed_partition, check_stages, stage_module
from phalanx.parallel.reporting import StageReporter
from phalanx.parallel.spec import StrategySpec
from phalanx.parallel.stages import boundary_shapes, gather_model
from phalanx.parallel.stats import ModelParallelStats
from phalanx.parallel.worker import StepReporter, WorkerKit
from phalanx.rules import apply_updates, make_rule
from phalanx.runtime.placement import DeviceSupport, Placement, setup_rank

DEVICE = DeviceSupport()  # activations between neighbouring ranks: NCCL-able


def world_size(cfg: RunConfig) -> int:
    return cfg.workers


def check_job(job: Job) -> None:
    cfg = job.config
    if cfg.split_layer:
        check_split_layer(job.build_model(), cfg.split_layer, cfg.workers)
    else:
        check_stages(job.build_model(), cfg.workers, "--workers")


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


class _LayerHooks(Hooks):
    """Stage ``rank`` of the layer pipeline without micro-batches: receive the previous
    stage's activations, run its layers, send them on; the gradients come back the same
    way. The straggler slows the compute, never the waits for a neighbour."""

    def __init__(self, job: Job, rank: int, world: int, place: Placement) -> None:
        cfg = self.cfg = job.config
        self.job, self.rank, self.world = job, rank, world
        self.staging, self.device = place.host_staging, place.torch_device
        model = self.full = job.build_model()
        model.train()
        self.shard = job.shard(0, 1)  # one stream of batches: every stage walks the same order
        self.total = job.planned_steps(len(self.shard))
        if cfg.batch_size > len(self.shard):
            raise ConfigError(
                f"--batch-size: {cfg.batch_size} exceeds the {len(self.shard)} training samples")
        self.part = agreed_partition(model, world, job.train.x[: cfg.batch_size])
        self.shapes = boundary_shapes(model, self.part, job.train.input_shape, cfg.batch_size,
                                      job.train.x.dtype)
        model.to(self.device)  # after the partition and the shapes were worked out on the host
        self.stage = stage_module(model, self.part.names[rank])
        self.first, self.last = rank == 0, rank == world - 1
        self.params = [p for p in self.stage.parameters() if p.requires_grad]
        self.weights = detached(self.params)
        self.rule = make_rule(cfg, self.total)
        self.state = self.rule.init(self.weights)
        # data index 0: the single-worker loop's augmentation draws (the first stage draws)
        self.kit = WorkerKit.of(cfg, 0, rank)
        self.aug = self.kit.aug if self.first else None
        self.data = DeviceData(job.train, self.device, place.data_on_device,
                               self.aug is not None)
        self.clock = _Clock()
        self.sent = 0

    def fetch(self, idx: torch.Tensor, first: bool):
        if self.first or self.last:
            return self.data.batch(idx, self.aug, self.kit.gen)
        return None, None

    def forward_backward(self, batch, scale: float, last: bool) -> Micro:
        x, y = batch
        rank, staging, clock, straggler = self.rank, self.staging, self.clock, self.kit.straggler
        # ---- forward: receive the previous stage's activations, run ours, pass on
        if not self.first:
            x = torch.empty(self.shapes[rank - 1], device=self.device)
            t = time.perf_counter()
            recv(x, rank - 1, staging)  # sync point: blocks until stage rank-1 finished
            clock.waited(t)
            x.requires_grad_(True)
        t = time.perf_counter()
        straggler.start()
        out = self.stage(x)
        loss = None
        if self.last:
            loss = self.kit.loss_fn(out, y)
            (loss * scale if scale != 1.0 else loss).backward()
        straggler.finish()
        clock.computed(t)
        if not self.last:
            self._backward_from_next(out)
        if not self.first:
            t = time.perf_counter()
            send(x.grad, rank - 1, staging)
            self.sent += x.grad.numel() * x.grad.element_size()
            clock.waited(t)
        return Micro(len(out), loss, out if self.last else None, y)

    def _backward_from_next(self, out: torch.Tensor) -> None:
        t = time.perf_counter()
        send(out.detach(), self.rank + 1, self.staging)
        self.sent += out.numel() * out.element_size()
        # ---- backward: the next stage hands back d loss / d out
        grad_out = torch.empty_like(out)
        recv(grad_out, self.rank + 1, self.staging)  # sync point: waits for all later stages
        self.clock.waited(t)
        t = time.perf_counter()
        self.kit.straggler.start()
        if out.requires_grad:  # a first stage without parameters has nothing to do
            out.backward(grad_out)
        self.kit.straggler.finish()
        self.clock.computed(t)

    def apply_update(self, step: int) -> dict:
        if self.params:  # a stage of parameter-free layers (flatten, relu) has no update
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
            updates, self.state = self.rule.update(grads, self.state, self.weights)
            apply_updates(self.weights, updates)
        for p in self.params:
            p.grad = None
        return {}

    def evaluate(self, report: StepReporter, step: int, epoch: int, samples: int) -> None:
        _evaluate(self.full, self.part, self.rank, self.world, report, step, epoch, samples)

    def checkpoint(self, pos: Position, final: bool) -> None:
        every = self.cfg.checkpoint_every
        if every and pos.step % every == 0:  # a collective: every stage gathers
            _checkpoint(self.job, self.full, self.part, self.rank, self.world, pos)


def _layer_parallel(rank: int, world: int, job: Job) -> None:
    cfg = job.config
    place = setup_rank(cfg, rank, world, DEVICE, data_bytes=train_bytes(job))
    hooks = _LayerHooks(job, rank, world, place)
    report = StageReporter(job, rank, hooks.total, "model-parallel", logs_loss=hooks.last)
    batches = batch_stream(hooks.shard, cfg.batch_size, cfg.seed)
    pos = Loop(cfg, report, hooks, batches, hooks.total).run()
    model, part = hooks.full, hooks.part
    gather_model(model, part, list(range(world)), rank, dst=0)
    # every rank's traffic and clocks, summed / collected on rank 0
    traffic = torch.tensor([float(hooks.sent)], dtype=torch.float64)
    dist.reduce(traffic, 0)
    clocks = torch.tensor([hooks.clock.compute, hooks.clock.wait], dtype=torch.float64)
    all_clocks = [torch.zeros(2, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(all_clocks, clocks)
    if rank == 0:
        stats = ModelParallelStats(
            bytes_sent=int(traffic.item()),
            bytes_per_sample=traffic.item() / max(pos.samples, 1),
            stages=world, partition=[",".join(n) for n in part.names],
            partition_source=part.source, stage_costs=list(part.costs),
            stage_compute_s=[round(c[0].item(), 4) for c in all_clocks],
            stage_wait_s=[round(c[1].item(), 4) for c in all_clocks])
        write_result(job, model.state_dict(), train_samples=pos.samples, steps=pos.step,
                     stats=stats)


def _evaluate(model, part, rank, world, report, step, epoch, samples) -> None:
    gather_model(model, part, list(range(world)), rank, dst=0)  # collective: all stages
    if rank == 0:
        report.evaluate(model, report.test, step, epoch, samples)


def _checkpoint(job: Job, model, part, rank: int, world: int, pos: Position) -> None:
    gather_model(model, part, list(range(world)), rank, dst=0)
    if rank == 0:  # the model only: each stage's rule state stays with its stage
        save_snapshot(job, model.state_dict(), pos)


SPEC = StrategySpec(
    name="model-parallel", summary="model parallel: layers (or one layer's columns, "
    "--split-layer) over --workers ranks", process_main=process_main, world_size=world_size,
    check_job=check_job, options=("split_layer", "split_at"), device=DEVICE)
