"""Tensor parallelism, Megatron-style: every transformer block split over ``--workers``
ranks, with ``torch.distributed.tensor.parallel`` (DTensor: gloo on the CPU; NCCL on GPUs, one per
rank: gloo does not carry its GPU collectives, see ``DEVICE``).

In each block the query, key and value projections and the MLP's first projection are
split by columns (``ColwiseParallel``: each rank holds a slice of the heads and of the
hidden units), the attention's and the MLP's output projections by rows
(``RowwiseParallel``): one allreduce of the activations per sublayer forward and one of
their gradients per sublayer backward (Shoeybi et al. 2019; q, k and v take their shared
input as one replicated tensor, :func:`shared_inputs`, else backward all-reduced it once
per projection: 1.5x the bytes, found by ``phalanx scale bytes``). Embeddings, LayerNorms and the
head stay replicated: every rank computes them on the same batch, so their gradients come
out equal on every rank and need no traffic.

Every rank sees the same batches. The update rule runs on each rank's own shards (a
sharded parameter's local tensor), so the run equals single-process training to rounding;
``--clip-grad-norm`` clips each rank's shards by their own norm. The model declares which
of its modules split how. The plan (:mod:`phalanx.parallel.tensor_plans`): the model's own
``tensor_plan`` attribute, phalanx's GPT's, or one derived for separate q/k/v projections
and two-layer MLPs in each block; any other model is refused in one line.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from phalanx.config import RunConfig
from phalanx.errors import ConfigError
from phalanx.parallel.base import Job
from phalanx.parallel.column_parallel import SameBatchHooks, train_same_batch
from phalanx.parallel.device_data import DeviceData, train_bytes
from phalanx.parallel.spec import StrategySpec
from phalanx.parallel.stats import TensorParallelStats
from phalanx.parallel.tensor_plans import check_plan, gpt_plan, tensor_plan
from phalanx.parallel.worker import WorkerKit
from phalanx.rules import make_rule
from phalanx.runtime.placement import DeviceSupport, Placement, setup_rank

# DTensor's collectives take the GPU tensors themselves; gloo has no way for all of them
# (two ranks sharing the GPU check's one H200 over gloo, 2026-11-27: rank 0 died of SIGSEGV)
DEVICE = DeviceSupport(gloo_gpu="tensor parallel's DTensor collectives run on the GPU "
                       "tensors themselves, and gloo does not carry them (a rank died of "
                       "SIGSEGV); give each rank its own GPU, or use --device cpu")


def check_job(job: Job) -> None:
    cfg = job.config
    model = job.build_model()
    gpt = gpt_plan(model)
    if gpt:  # phalanx's GPT: its heads say it best
        block = model.get_submodule(next(iter(gpt)))
        heads = block.attn.q.out_features // block.attn.head_dim
        if heads % cfg.workers or block.mlp.fc.out_features % cfg.workers:
            raise ConfigError(f"--workers: {cfg.workers} ranks cannot share {heads} attention "
                              f"heads (--gpt-heads) evenly; use a divisor of {heads}")
    check_plan(model, job.train.x[:2], cfg.workers)  # a user's plan, or one derived


def world_size(cfg: RunConfig) -> int:
    return cfg.workers


def shared_inputs(plan: dict[str, str]) -> list[str]:
    """The modules of a block (names relative to it) whose column-split children read the
    module's input: two or more ``colwise`` layers under one parent that is not the block
    itself (the attention's q, k and v). Each such parent takes its input as one replicated
    tensor, so backward all-reduces that input's gradient once (Megatron's f operator);
    split separately, torch's ``ColwiseParallel`` all-reduces it once per layer (q, k, v:
    three; measured with the kernel's counters, ``phalanx scale bytes``: 24 activation
    all-reduces a step for 4 GPT blocks instead of 16)."""
    parents: dict[str, int] = {}
    for name, style in plan.items():
        parent = name.rpartition(".")[0]
        if style == "colwise" and parent:
            parents[parent] = parents.get(parent, 0) + 1
    return sorted(p for p, k in parents.items() if k >= 2)


def backward_reductions(plan: dict[str, str]) -> int:
    """All-reduces of an input's gradient per block backward: one per column-split layer
    that reads its own input, one per shared input (:func:`shared_inputs`)."""
    shared = shared_inputs(plan)
    alone = sum(1 for name, style in plan.items()
                if style == "colwise" and name.rpartition(".")[0] not in shared)
    return alone + len(shared)


def _parallelize(model: nn.Module, world: int, device: torch.device) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        parallelize_module,
    )

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    mesh = init_device_mesh(device.type, (world,))
    for name, plan in tensor_plan(model).items():
        block = model.get_submodule(name)
        layout = {k: styles[v]() for k, v in plan.items()}
        for parent in shared_inputs(plan):
            layout[parent] = PrepareModuleInput(input_layouts=(Replicate(),),
                                                desired_input_layouts=(Replicate(),),
                                                use_local_output=False)
        parallelize_module(block, mesh, layout)


def _local(t: torch.Tensor) -> torch.Tensor:
    """A sharded tensor's own shard (shares its storage), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


class _TensorHooks(SameBatchHooks):
    """Every rank computes on the same batches; its shards and the replicated layers get
    its own update (the replicated ones come out equal on every rank)."""

    def __init__(self, job: Job, rank: int, world: int, place: Placement) -> None:
        cfg = self.cfg = job.config
        self.job, self.rank, self.world = job, rank, world
        self.model = model = job.build_model()
        model.train()
        model.to(place.torch_device)
        plan = tensor_plan(model)
        rows = [model.get_submodule(f"{b}.{n}") for b, p in plan.items()
                for n, style in p.items() if style == "rowwise"]
        width = rows[0].out_features if rows else 0  # the activations' (before the split)
        _parallelize(model, world, place.torch_device)
        self.params = [p for p in model.parameters() if p.requires_grad]
        with torch.no_grad():
            self.weights = [_local(p).detach() for p in self.params]
        self.shard = job.shard(0, 1)  # every rank computes on the same batches
        self.total = job.planned_steps(len(self.shard))
        self.rule = make_rule(cfg, self.total)
        self.state = self.rule.init(self.weights)
        self.kit = WorkerKit.of(cfg, 0, rank)  # the same draws on every rank
        self.data = DeviceData(job.train, place.torch_device, place.data_on_device,
                               self.kit.aug is not None)
        # per sample: an allreduce forward per row-split layer (the attention's and the
        # MLP's outputs) and one backward per input of column-split layers (their inputs'
        # gradients: q, k and v share one), each of context x width values, ring-style
        # (2 (N-1)/N of the tensor per rank)
        tokens = job.train.x[0].numel()
        inputs = sum(backward_reductions(p) for p in plan.values())
        self.per_sample = (len(rows) + inputs) * 4 * tokens * width * 2 * (world - 1) / world
        self.sent = 0.0

    def grads(self) -> list[torch.Tensor]:
        return [_local(p.grad) for p in self.params]  # a sharded gradient's own shard

    def whole(self) -> nn.Module:
        """The whole model, its shards gathered (a collective: every rank calls it)."""
        return assembled(self.job, self.model)


def assembled(job: Job, model: nn.Module) -> nn.Module:
    """A plain copy of ``model`` with every shard gathered (collective, in state order)."""
    state = {}
    for key, value in model.state_dict().items():
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        state[key] = full.detach().clone()
    whole = copy.deepcopy(job.build_model()).to(next(iter(state.values())).device)
    whole.load_state_dict(state)
    return whole


def process_main(rank: int, world: int, job: Job) -> None:
    place = setup_rank(job.config, rank, world, DEVICE, data_bytes=train_bytes(job))
    hooks = _TensorHooks(job, rank, world, place)
    train_same_batch(job, rank, hooks, "tensor", lambda sent, per, final: (
        TensorParallelStats(bytes_sent=sent, bytes_per_sample=per, tensor_parallel=world,
                            split_blocks=len(tensor_plan(final)))))


SPEC = StrategySpec(
    name="tensor", summary="tensor parallel (Megatron): each GPT block's heads and MLP "
    "split over --workers ranks (torch.distributed.tensor)", process_main=process_main,
    world_size=world_size, check_job=check_job, device=DEVICE,
    example={"model": "gpt", "data": "shakespeare", "gpt_layers": 1, "gpt_dim": 16,
             "gpt_heads": 2, "context": 8, "workers": 2, "train_limit": 400})
