"""Splitting a model that is not an ``nn.Sequential``: a transformer written for plain
PyTorch, with a ``ModuleList`` of blocks (nanoGPT's ``transformer.h``, minGPT's
``blocks``, torchtitan's ``layers``).

Such a model is cut at block boundaries, as torchtitan does (a stage keeps a range of
blocks), without changing the model's code. The model is seen as layers:

- ``pre``: everything the forward runs before the first block (embeddings, dropout):
  the modules registered before the block list, and parameters held by the model itself;
- ``block0`` ... ``block{N-1}``: the blocks, each called with one tensor;
- ``post``: everything after the last block (final norm, head): the modules registered
  after the block list.

``pre`` runs the model's own ``forward`` and stops at the first block's input (a forward
pre-hook raises with it). ``post`` runs the model's ``forward`` on a dummy input with the
blocks swapped for pass-throughs, the last one handing over the activation it was given:
the final layers run as the model wrote them. What a model must expose to be split:

1. a list of blocks at any depth: the largest ``ModuleList`` or ``nn.Sequential`` of
   same-class modules (or the one ``--split-at`` names), each block taking and returning
   one tensor;
2. its modules registered in the order its forward uses them (before the blocks, then
   after: true of nanoGPT, minGPT and torchtitan's models);
3. a first input of token ids (B, T) whose activations are (B, T, ...);
4. no parameter shared between the layers of two stages: tied input and output
   embeddings are refused with the reason (Megatron sums their gradients across the first
   and last stage; phalanx does not).

An ``nn.Sequential`` (phalanx's own GPT is one) is cut between its children instead.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict

import torch
from torch import nn

from phalanx.errors import ConfigError
from phalanx.models.loss import logits_of


class _Stop(Exception):
    def __init__(self, value: torch.Tensor) -> None:
        super().__init__("stop at the first block")
        self.value = value


# the attribute naming a model's block list (``--split-at``, set by Job.build_model; a
# model may set it itself): a qualified name as torch.distributed.pipelining names split
# points, e.g. "transformer.h"
SPLIT_AT = "phalanx_blocks"
LISTS = (nn.ModuleList, nn.Sequential)


def _size(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def block_lists(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every list of modules below the root at any depth (``ModuleList`` or
    ``nn.Sequential``) whose children are all of one class: the candidates for blocks."""
    return [(name, m) for name, m in model.named_modules()
            if name and isinstance(m, LISTS) and len(m)
            and len({type(c) for c in m.children()}) == 1]


def find_blocks(model: nn.Module) -> tuple[str, nn.Module] | None:
    """The model's block list (None: none): the one it names (:data:`SPLIT_AT`), else the
    largest (by parameters) list of same-class modules at any depth (nanoGPT's
    ``transformer.h``, minGPT's ``blocks``, a ``Sequential`` of blocks), else its largest
    ``ModuleList``."""
    named = model.__dict__.get(SPLIT_AT, "")
    if named:
        return named, model.get_submodule(named)
    found = block_lists(model)
    if not found:  # blocks of several classes: the largest list of them
        found = [(n, m) for n, m in model.named_modules()
                 if n and isinstance(m, nn.ModuleList) and len(m)]
    if not found:
        return None
    return max(found, key=lambda nm: _size(nm[1]))


def cut_between_children(model: nn.Module) -> bool:
    """An ``nn.Sequential`` is cut between its children, unless ``--split-at`` named a
    block list inside it."""
    return isinstance(model, nn.Sequential) and not model.__dict__.get(SPLIT_AT, "")


def name_blocks(model: nn.Module, name: str) -> None:
    """``--split-at NAME``: ``model``'s block list is the module ``name`` (one line if it
    is not a list of modules)."""
    lists = ", ".join(n for n, _ in block_lists(model)) or "none"
    try:
        module = model.get_submodule(name)
    except AttributeError:
        raise ConfigError(f"--split-at {name}: the model has no module of that name (its "
                          f"lists of blocks: {lists})") from None
    if not isinstance(module, LISTS) or not len(module):
        raise ConfigError(f"--split-at {name}: a {type(module).__name__}, not a ModuleList or "
                          f"nn.Sequential of blocks (the model's: {lists})")
    model.__dict__[SPLIT_AT] = name  # a plain attribute: copies and deep copies keep it


def _leaves_around(model: nn.Module, blocks_name: str) -> tuple[list[str], list[str]]:
    """Names of the modules registered before and after the block list (the outermost
    ones that neither contain it nor lie inside it)."""
    before, after, seen = [], [], False
    ancestors = {blocks_name.rsplit(".", k)[0] for k in range(1, blocks_name.count(".") + 1)}

    def walk(module: nn.Module, prefix: str) -> None:
        nonlocal seen
        for child_name, child in module.named_children():
            full = f"{prefix}{child_name}"
            if full == blocks_name:
                seen = True
            elif full in ancestors:
                walk(child, full + ".")
            else:
                (after if seen else before).append(full)

    walk(model, "")
    return before, after


class _Pass(nn.Module):
    """A block's stand-in in ``post``: hands its input on, or (the last) the activation."""

    def __init__(self, slot: list) -> None:
        super().__init__()
        self.__dict__["slot"] = slot

    def forward(self, x, *args, **kwargs):
        return self.slot[0] if self.slot else x


class _Part(nn.Module):
    """``pre`` or ``post``: owns (registers) its modules and parameters only; the model is
    held unregistered, so ``parameters()`` is exactly this layer's."""

    def __init__(self, model: nn.Module, blocks: nn.ModuleList, modules: list[str],
                 own_params: list[str], first: bool) -> None:
        super().__init__()
        self.__dict__["model"], self.__dict__["blocks"] = model, blocks
        self.first = first
        self.parts = nn.ModuleDict({n.replace(".", "__"): model.get_submodule(n) for n in modules})
        self.own = nn.ParameterList([model.get_parameter(n) for n in own_params])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        model, blocks = self.__dict__["model"], self.__dict__["blocks"]
        if self.first:  # the forward up to the first block's input
            def stop(_module, args):
                raise _Stop(args[0])

            handle = blocks[0].register_forward_pre_hook(stop)
            try:
                model(x)
            except _Stop as s:
                return s.value
            finally:
                handle.remove()
            raise RuntimeError("the model's forward never called its first block")
        # the forward after the last block: blocks swapped for pass-throughs, the last one
        # handing over x; the input is a dummy of token ids (its embeddings are discarded)
        slot: list = []
        saved = blocks._modules
        stand_ins = [_Pass([]) for _ in range(len(saved))]
        stand_ins[-1] = _Pass(slot)
        slot.append(x)
        dummy = torch.zeros(x.shape[:2], dtype=torch.long, device=x.device)
        with contextlib.ExitStack() as undo:
            blocks._modules = OrderedDict((k, m) for k, m in zip(saved, stand_ins))
            undo.callback(setattr, blocks, "_modules", saved)
            # the logits of what the model returns (nanoGPT's (logits, loss), an object
            # with .logits): a stage hands on tensors
            return logits_of(model(dummy))


class BlockView:
    """A non-sequential model seen as ``pre``, ``block0``..., ``post`` (the module doc)."""

    def __init__(self, model: nn.Module) -> None:
        found = find_blocks(model)
        if found is None:
            raise ValueError("no ModuleList of blocks")
        self.blocks_name, blocks = found
        before, after = _leaves_around(model, self.blocks_name)
        root = [n for n, _ in model.named_parameters(recurse=False)]
        self.prefixes: dict[str, tuple[str, ...]] = {
            "pre": tuple(f"{n}." for n in before) + tuple(root),
            **{f"block{i}": (f"{self.blocks_name}.{i}.",) for i in range(len(blocks))},
            "post": tuple(f"{n}." for n in after),
        }
        self.layers: list[tuple[str, nn.Module]] = [
            ("pre", _Part(model, blocks, before, root, first=True)),
            *((f"block{i}", b) for i, b in enumerate(blocks)),
            ("post", _Part(model, blocks, after, [], first=False)),
        ]

    def keys(self, state_keys, name: str) -> list[str]:
        """The state-dict keys (of ``state_keys``, the model's) that layer ``name`` owns."""
        prefixes = self.prefixes[name]
        return [k for k in state_keys if k in prefixes or k.startswith(
            tuple(p for p in prefixes if p.endswith(".")))]


def shared_parameters(layers: list[tuple[str, nn.Module]]) -> list[tuple[str, str]]:
    """Pairs of layers that hold the same parameter (tied weights)."""
    owner: dict[int, str] = {}
    pairs = []
    for name, layer in layers:
        for p in layer.parameters():
            if id(p) in owner and owner[id(p)] != name:
                pairs.append((owner[id(p)], name))
            owner.setdefault(id(p), name)
    return pairs
