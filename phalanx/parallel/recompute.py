"""Activation checkpointing (``--activation-checkpoint K``): every K-th block of a block
model recomputes its forward in backward instead of keeping its activations, as
``torch.utils.checkpoint`` (non-reentrant) does for torchtitan's and Megatron's blocks.

The blocks: an ``nn.Sequential``'s children of the class that holds the most parameters
among those repeated and made of layers (phalanx's GPT: its ``Block`` s), else the model's
block list (:func:`~phalanx.parallel.blocks.find_blocks`: nanoGPT's ``transformer.h``). The block
keeps its class, parameters and names (its ``forward`` is wrapped on the instance), so
checkpoints, state dicts and every strategy see the same model; dropout draws the same
numbers again in the recomputation (the RNG state is kept), so the run's numbers are the
ones without it (tested). What it saves is memory: the saved activations of a wrapped
block are its input only.
"""

from __future__ import annotations

from collections import defaultdict

from torch import nn
from torch.utils.checkpoint import checkpoint

from phalanx.errors import ConfigError
from phalanx.parallel.blocks import cut_between_children, find_blocks


class _Recomputed:
    """A block's forward through ``torch.utils.checkpoint`` (picklable: a model with it
    can still be handed to processes)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, *args, **kwargs):
        return checkpoint(type(self.module).forward, self.module, *args, use_reentrant=False,
                          **kwargs)


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks (see the module); [] if it has none."""
    if cut_between_children(model):
        by_class: dict[type, list[nn.Module]] = defaultdict(list)
        for child in model.children():
            by_class[type(child)].append(child)
        # a block is made of layers: repeated nn.Linear layers (an MLP) are not blocks
        repeated = [ms for ms in by_class.values() if len(ms) > 1
                    and any(True for _ in ms[0].children())
                    and any(p.numel() for m in ms for p in m.parameters())]
        if repeated:
            return max(repeated, key=lambda ms: sum(p.numel() for m in ms
                                                    for p in m.parameters()))
    found = find_blocks(model)
    return list(found[1]) if found is not None else []


def checkpoint_blocks(model: nn.Module, every: int, name: str = "the model") -> int:
    """Wrap every ``every``-th block (the 1st, the (every+1)-th, ...); returns how many."""
    blocks = blocks_of(model)
    if not blocks:
        raise ConfigError(f"--activation-checkpoint: {name} has no blocks to recompute (an "
                          "nn.Sequential with repeated blocks, or a ModuleList of blocks)")
    chosen = blocks[::every]
    for block in chosen:
        block.forward = _Recomputed(block)
    return len(chosen)
