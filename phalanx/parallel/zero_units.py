"""The units of sharded data parallel: groups of parameters that are gathered, reduced and
freed together (FSDP's "wrapped modules", DeepSpeed's partitions), each one flat buffer.

A unit's parameters are views into one flat buffer of N x S values (S = ceil(P_u / N), the
tail zeros), so rank r's shard is the slice ``[r S, (r + 1) S)`` of it: the optimizer
updates that slice in place, with no copy of the weights (stages 1 and 2). Stage 3 keeps
only the shard (a tensor of its own) and frees the buffer's storage between uses: the
parameters stay the same tensors (autograd saved them in forward), their storage is
resized to nothing and back, and the gathered values are written under a preserved
version counter, as FSDP2 does.

Units follow the model's structure, as FSDP's per-block wrapping: an ``nn.Sequential``'s
children; else each block of the model's block list (:func:`~phalanx.parallel.blocks.find_blocks`:
nanoGPT's ``transformer.h``) with every other parameter in one root unit; else the whole
model as one unit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from phalanx.comm.sharded import Sharded, ShardLayout
from phalanx.parallel.blocks import cut_between_children, find_blocks


@dataclass(eq=False)
class Unit:
    """Parameters gathered and reduced together: ``module`` (None: the root, the
    parameters outside every block), the flat buffer they view, this rank's shard."""

    name: str
    module: nn.Module | None
    params: list[nn.Parameter]
    layout: ShardLayout
    full: torch.Tensor  # N x S values; the parameters are views of its first P_u
    # this rank's S values, fp32: the master weights the rule updates (a view of ``full``
    # unless stage 3 or a bf16 ``full``)
    shard: torch.Tensor
    gathered: bool = True
    pending: int = 0  # gradients still to come in this backward
    reduced: bool = False
    handles: list = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return self.full.numel() * self.full.element_size()

    def free(self) -> None:
        """Stage 3: drop the full values (the parameters keep their tensors, empty)."""
        if self.gathered:
            self.full.untyped_storage().resize_(0)
            self.gathered = False

    def gather(self, sharded: Sharded) -> None:
        """Stage 3: every rank's shard into the full buffer again (an all-gather)."""
        if self.gathered:
            return
        self.full.untyped_storage().resize_(self.nbytes)
        # autograd saved these parameters in forward: writing them must not look like an
        # in-place change of a saved tensor (the values are the same ones)
        with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(self.full):
            self.refresh(sharded)
        self.gathered = True

    def refresh(self, sharded: Sharded) -> None:
        """Every rank's master shard into ``full``, in ``full``'s dtype (bf16: rounded, and
        sent as bf16; fp32: the shard as it is)."""
        with torch.no_grad():
            sharded.all_gather(self.shard.to(self.full.dtype), self.full)

    def flat_grad(self) -> torch.Tensor:
        """The unit's gradients as one padded vector (a parameter without one: zeros, as
        DDP's find_unused_parameters)."""
        out = torch.zeros(self.layout.padded, dtype=self.full.dtype, device=self.full.device)
        offset = 0
        for p in self.params:
            n = p.numel()
            if p.grad is not None:
                out[offset : offset + n].copy_(p.grad.reshape(-1))
            offset += n
        return out


def unit_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of each unit that is a module, in forward order."""
    if cut_between_children(model):
        return [(n, m) for n, m in model.named_children()
                if any(p.requires_grad for p in m.parameters())]
    found = find_blocks(model)
    if found is None:
        return []
    name, blocks = found
    return [(f"{name}.{i}", b) for i, b in enumerate(blocks)]


def make_units(model: nn.Module, params: list[nn.Parameter], rank: int, world: int,
               own_shard: bool, dtype: torch.dtype | None = None,
               start: Callable[[torch.Tensor], None] | None = None) -> list[Unit]:
    """The model's units, their parameters moved into flat buffers (values kept), one unit
    at a time: a unit's parameters give up their own storage as soon as its buffer holds
    them, so the model is never held twice. ``own_shard``: each shard is a tensor of its
    own (stage 3), not a view of the buffer, and the buffer is freed at once: by the last
    unit the rank holds its shards only. ``dtype``: the buffers' (and so the parameters'
    and gradients') dtype, bf16 under ``--precision bf16`` (None: the parameters' own);
    the shards stay in the parameters' dtype (fp32 masters) and are tensors of their own
    when the two differ. ``start(values)``: makes every rank's unit values rank 0's (a
    broadcast of the unit's real values, before they are cut into shards)."""
    trainable = {id(p) for p in params}
    seen: set[int] = set()
    groups: list[tuple[str, nn.Module | None, list[nn.Parameter]]] = []
    for name, module in unit_modules(model):
        mine = [p for p in module.parameters() if id(p) in trainable and id(p) not in seen]
        seen.update(id(p) for p in mine)
        if mine:
            groups.append((name, module, mine))
    rest = [p for p in params if id(p) not in seen]
    if rest:
        groups.insert(0, ("root", None, rest))  # the embeddings, the head: used first and last
    units = []
    for name, module, group in groups:
        layout = ShardLayout(sum(p.numel() for p in group), world)
        master = torch.zeros(layout.padded, dtype=group[0].dtype, device=group[0].device)
        offset = 0
        with torch.no_grad():
            for p in group:
                n = p.numel()
                master[offset : offset + n].copy_(p.reshape(-1))
                offset += n
            if start is not None:
                start(master[: layout.numel])
            full = master if dtype in (None, master.dtype) else master.to(dtype)
            offset = 0
            for p in group:  # p's own storage is released here (nothing else holds it)
                n = p.numel()
                p.data = full[offset : offset + n].view_as(p)
                offset += n
        lo = rank * layout.shard
        shard = master[lo : lo + layout.shard]
        unit = Unit(name, module, group, layout, full,
                    shard.clone() if own_shard or full is not master else shard)
        if own_shard:
            unit.free()
        units.append(unit)
        del master, full, shard  # the unit holds what it keeps
    return units


def check_uniform(params: list[nn.Parameter]) -> str:
    """Why these parameters cannot share flat buffers ("" if they can)."""
    kinds = {(p.dtype, p.device) for p in params}
    if len(kinds) > 1:
        return f"its parameters mix dtypes or devices ({sorted(map(str, kinds))})"
    return ""
