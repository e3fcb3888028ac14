"""One ``nn.Linear`` split across workers by output features (column parallelism).

Worker r holds rows ``lo_r:hi_r`` of the weight (a slice of the output features) and the
matching bias slice. Forward: every worker multiplies the *same* input by its slice and
the slices are all-gathered into the full output. Backward: the output gradient is cut
back to each worker's slice (no communication), and the input gradient, to which every
slice contributes ``g_r @ W_r``, is summed across workers with an all-reduce.

Used by ``--strategy model-parallel --split-layer NAME``: all workers see the same
batches, run the other layers replicated (their gradients come out identical, so they
stay equal without synchronisation) and each updates its own weight slice.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from phalanx.comm.allreduce import chunk_bounds
from phalanx.comm.staging import gloo_carries
from phalanx.errors import ConfigError
from phalanx.parallel.base import Job, detached, write_result
from phalanx.parallel.device_data import DeviceData, train_bytes
from phalanx.parallel.dp_checkpoint import save_snapshot
from phalanx.parallel.loop import Batch, Hooks, Loop, Micro, Position, backward, batch_stream
from phalanx.parallel.reporting import StageReporter
from phalanx.parallel.stats import ColumnParallelStats
from phalanx.parallel.worker import StepReporter, WorkerKit
from phalanx.rules import apply_updates, make_rule
from phalanx.runtime.placement import DeviceSupport, Placement, setup_rank


def shard_bounds(features: int, world: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` output features of each worker; sizes differ by at most one."""
    if not 1 <= world <= features:
        raise ValueError(f"cannot split {features} features over {world} workers")
    return chunk_bounds(features, world)  # the ring's chunking: the same contiguous split


def split_linear(layer: nn.Linear, world: int) -> list[nn.Linear]:
    """The ``world`` column shards of ``layer`` as independent layers (copies)."""
    shards = []
    for lo, hi in shard_bounds(layer.out_features, world):
        s = nn.Linear(layer.in_features, hi - lo, bias=layer.bias is not None)
        with torch.no_grad():
            s.weight.copy_(layer.weight[lo:hi])
            if layer.bias is not None:
                s.bias.copy_(layer.bias[lo:hi])
        shards.append(s)
    return shards


def column_parallel_forward(x: torch.Tensor, shards: list[nn.Linear]) -> torch.Tensor:
    """The column-parallel computation in one process: each shard on the same input,
    outputs concatenated (what the all-gather assembles across processes)."""
    return torch.cat([s(x) for s in shards], dim=-1)


def _all_gather_padded(local: torch.Tensor, bounds: list[tuple[int, int]],
                       group) -> torch.Tensor:
    """All-gather slices of the last dimension whose sizes may differ by one (gloo's
    all_gather needs equal sizes: pad to the largest, trim after)."""
    width = max(hi - lo for lo, hi in bounds)
    pad = width - local.shape[-1]
    padded = F.pad(local, (0, pad)).contiguous() if pad else local.contiguous()
    device = padded.device
    if gloo_carries(padded):
        padded = padded.to("cpu")  # gloo's all_gather takes host tensors only
    parts = [torch.empty_like(padded) for _ in bounds]
    dist.all_gather(parts, padded, group=group)
    parts = [p.to(device) for p in parts]
    return torch.cat([p[..., : hi - lo] for p, (lo, hi) in zip(parts, bounds)], dim=-1)


class _CopyToParallel(torch.autograd.Function):
    """Identity forward; backward sums the input gradient over workers (each slice of the
    weight contributes a part of d loss / d x)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        host = grad.to("cpu") if gloo_carries(grad) else grad
        dist.all_reduce(host, group=ctx.group)  # sync point: every worker's slice
        return (grad.copy_(host) if host is not grad else grad), None


class _GatherFromParallel(torch.autograd.Function):
    """All-gather of the output slices forward; backward keeps this worker's slice."""

    @staticmethod
    def forward(ctx, local, bounds, rank, group):
        ctx.lo, ctx.hi = bounds[rank]
        return _all_gather_padded(local, bounds, group)

    @staticmethod
    def backward(ctx, grad):
        return grad[..., ctx.lo : ctx.hi].contiguous(), None, None, None


class ColumnParallelLinear(nn.Module):
    """This worker's slice of a Linear; ``forward`` returns the full output."""

    def __init__(self, full: nn.Linear, rank: int, world: int, group=None) -> None:
        super().__init__()
        self.bounds = shard_bounds(full.out_features, world)
        self.rank, self.group = rank, group
        self.in_features, self.out_features = full.in_features, full.out_features
        lo, hi = self.bounds[rank]
        self.weight = nn.Parameter(full.weight.detach()[lo:hi].clone())
        self.bias = (nn.Parameter(full.bias.detach()[lo:hi].clone())
                     if full.bias is not None else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _CopyToParallel.apply(x, self.group)
        local = F.linear(x, self.weight, self.bias)
        return _GatherFromParallel.apply(local, self.bounds, self.rank, self.group)

    @torch.no_grad()
    def assemble_into(self, full: nn.Linear) -> None:
        """Collective: every worker calls it; ``full`` receives the whole weight."""
        full.weight.copy_(_all_gather_padded(self.weight.t(), self.bounds, self.group).t())
        if self.bias is not None:
            full.bias.copy_(_all_gather_padded(self.bias, self.bounds, self.group))


def check_split_layer(model: nn.Module, name: str, world: int) -> nn.Linear:
    try:
        layer = model.get_submodule(name)
    except AttributeError:
        raise ConfigError(f"--split-layer: the model has no layer {name!r}") from None
    if not isinstance(layer, nn.Linear):
        raise ConfigError(f"--split-layer: {name!r} is a {type(layer).__name__}, not nn.Linear")
    if layer.out_features < world:
        raise ConfigError(f"--split-layer: {name!r} has {layer.out_features} output features, "
                          f"fewer than --workers {world}")
    return layer


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


class SameBatchHooks(Hooks):
    """What the strategies that split layers across ranks share (``--split-layer``'s
    column parallel, tensor parallel): every rank computes on the same batches, sends
    ``per_sample`` bytes per sample, updates its own slices and replicated layers with its
    rule, and assembles the whole model (``whole``, a collective) to evaluate and
    checkpoint it on rank 0 (the model only: each rank's rule state stays with it)."""

    job: Job
    cfg: object
    rank: int
    model: nn.Module
    data: DeviceData
    kit: WorkerKit
    rule: object
    state: object
    weights: list[torch.Tensor]
    per_sample: float
    sent: float

    def whole(self) -> nn.Module:
        raise NotImplementedError

    def grads(self) -> list[torch.Tensor]:
        """This rank's gradients, in the order of ``weights``."""
        return [p.grad for p in self.params]

    def fetch(self, idx: torch.Tensor, first: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data.batch(idx, self.kit.aug, self.kit.gen)

    def forward_backward(self, batch: Batch, scale: float, last: bool) -> Micro:
        self.sent += self.per_sample * len(batch[1])
        return backward(self.model, self.kit.loss_fn, batch, scale)

    def apply_update(self, step: int) -> dict:
        updates, self.state = self.rule.update(self.grads(), self.state, self.weights)
        apply_updates(self.weights, updates)
        for p in self.params:
            p.grad = None
        return {}

    def evaluate(self, report: StepReporter, step: int, epoch: int, samples: int) -> None:
        whole = self.whole()
        if self.rank == 0:
            report.evaluate(whole, report.test, step, epoch, samples)

    def checkpoint(self, pos: Position, final: bool) -> None:
        every = self.cfg.checkpoint_every
        if every and pos.step % every == 0:
            whole = self.whole()
            if self.rank == 0:
                save_snapshot(self.job, whole.state_dict(), pos)


class _ColumnHooks(SameBatchHooks):
    """Every worker computes on the same batches; its slice of the split layer and the
    replicated layers get its own update (the replicated ones come out equal everywhere)."""

    def __init__(self, job: Job, rank: int, world: int, place: Placement) -> None:
        cfg = self.cfg = job.config
        self.job, self.rank, self.world = job, rank, world
        self.model = model = job.build_model()
        model.train()
        self.full = check_split_layer(model, cfg.split_layer, world)
        self.split = ColumnParallelLinear(self.full, rank, world)
        _set_submodule(model, cfg.split_layer, self.split)
        model.to(place.torch_device)
        self.full.to(place.torch_device)  # the whole layer is assembled there for evaluation
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.weights = detached(self.params)
        self.shard = job.shard(0, 1)  # every worker computes on the same batches
        self.total = job.planned_steps(len(self.shard))
        self.rule = make_rule(cfg, self.total)
        self.state = self.rule.init(self.weights)
        self.kit = WorkerKit.of(cfg, 0, rank)  # data index 0: the same draws on every worker
        self.data = DeviceData(job.train, place.torch_device, place.data_on_device,
                               self.kit.aug is not None)
        # per micro-batch: all-gather of this worker's output slice to the others, and a
        # ring-style all-reduce of the layer's input gradient (2 (N-1)/N of it per worker)
        lo, hi = self.split.bounds[rank]
        self.per_sample = 4 * ((hi - lo) * (world - 1)
                               + 2 * self.split.in_features * (world - 1) / world)
        self.sent = 0.0

    def whole(self) -> nn.Module:
        """The model with the whole layer assembled (a collective: every worker)."""
        return _assembled(self.model, self.split, self.full, self.cfg.split_layer)


def train_same_batch(job: Job, rank: int, hooks: SameBatchHooks, label: str,
                     make_stats) -> None:
    """The loop of a :class:`SameBatchHooks` strategy and its result: every rank's bytes
    summed on rank 0, which writes the assembled model and ``make_stats(sent, per_sample,
    final)``."""
    cfg = job.config
    report = StageReporter(job, rank, hooks.total, label, logs_loss=rank == 0)
    batches = batch_stream(hooks.shard, cfg.batch_size, cfg.seed)
    pos = Loop(cfg, report, hooks, batches, hooks.total, straggler=hooks.kit.straggler).run()
    final = hooks.whole()  # collective: every rank
    traffic = torch.tensor([hooks.sent], dtype=torch.float64)
    dist.reduce(traffic, 0)
    if rank == 0:
        stats = make_stats(int(traffic.item()), traffic.item() / max(pos.samples, 1), final)
        write_result(job, final.state_dict(), train_samples=pos.samples, steps=pos.step,
                     stats=stats)


def process_main(rank: int, world: int, job: Job) -> None:
    cfg = job.config
    place = setup_rank(cfg, rank, world, DeviceSupport(), data_bytes=train_bytes(job))
    hooks = _ColumnHooks(job, rank, world, place)
    bounds = [list(b) for b in hooks.split.bounds]
    train_same_batch(job, rank, hooks, "split-layer", lambda sent, per, final: (
        ColumnParallelStats(bytes_sent=sent, bytes_per_sample=per,
                            split_layer=cfg.split_layer, split_bounds=bounds)))


def _assembled(model: nn.Module, split: ColumnParallelLinear, full: nn.Linear,
               name: str) -> nn.Module:
    """A copy of the model with the whole layer in place of the slice (collective)."""
    split.assemble_into(full)
    whole = copy.deepcopy(model)
    _set_submodule(whole, name, copy.deepcopy(full))
    return whole
