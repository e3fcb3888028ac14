"""What model-parallel, pipeline and hybrid training share: the shapes that cross stage
boundaries, collecting the stages' weights into one model, and guards on the model."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from phalanx.errors import ConfigError
from phalanx.parallel.partition import Partition, layer_keys, stage_module


def boundary_shapes(model: nn.Module, partition: Partition,
                    input_shape: Sequence[int], batch: int,
                    dtype: torch.dtype = torch.float32) -> list[tuple[int, ...]]:
    """Shape of each stage's output for a batch of ``batch`` samples (the last one is the
    model output). Every process computes them itself, so no shapes travel."""
    probe = copy.deepcopy(model).eval()  # a copy: BatchNorm statistics stay untouched
    x = torch.zeros(1, *input_shape, dtype=dtype)
    shapes = []
    with torch.no_grad():
        for names in partition.names:
            x = stage_module(probe, names)(x)
            shapes.append((batch, *x.shape[1:]))
    return shapes


def batchnorm_layers(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def refuse_batchnorm_with_microbatches(model: nn.Module, microbatches: int, flag: str) -> None:
    """BatchNorm normalises by the statistics of the tensor it sees: a pipeline feeds it
    micro-batches, so results would differ from full-batch training. Refuse, saying why."""
    bn = batchnorm_layers(model)
    if bn and microbatches > 1:
        raise ConfigError(
            f"{flag}: the model has BatchNorm ({', '.join(bn[:3])}{', ...' if len(bn) > 3 else ''})"
            f" whose batch statistics would be per micro-batch, not per batch; use "
            f"--microbatches 1 or a model without BatchNorm")


def layer_state_keys(model: nn.Module, names: Sequence[str]) -> list[str]:
    """State-dict keys (parameters and buffers) of the layers ``names``."""
    return layer_keys(model, names)


def gather_model(model: nn.Module, partition: Partition, stage_ranks: Sequence[int],
                 rank: int, dst: int, group: dist.ProcessGroup | None = None) -> int:
    """Copy every stage's layers into ``model`` on rank ``dst`` (stage k lives on
    ``stage_ranks[k]``); returns the bytes this rank sent.

    Every process built the full model, so the receiver knows each tensor's shape and
    dtype: only raw tensors travel, in state-dict order, no headers, nothing pickled.
    """
    state = model.state_dict()
    sent = 0
    for stage, names in enumerate(partition.names):
        owner = stage_ranks[stage]
        if owner == dst:
            continue
        for key in layer_state_keys(model, names):
            t = state[key]
            # host tensors: gloo carries them whatever device the stages compute on
            if rank == owner:
                dist.send(t.detach().to("cpu").contiguous(), dst, group=group)
                sent += t.numel() * t.element_size()
            elif rank == dst:
                buf = torch.empty(t.shape, dtype=t.dtype)
                dist.recv(buf, owner, group=group)
                with torch.no_grad():
                    t.copy_(buf)
    return sent
