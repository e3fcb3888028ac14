"""Which layers tensor parallelism splits, and how (``--strategy tensor``): a plan,
``{block: {layer: "colwise" | "rowwise"}}`` with names relative to the model and to each
block, as ``torch.distributed.tensor.parallel.parallelize_module`` takes them.

Where a plan comes from, first found first:

1. the model's own ``tensor_plan`` attribute (a dict in that shape: a user's declaration,
   as torchtitan's models carry theirs);
2. phalanx's GPT: every ``Block``'s q, k, v and MLP input projection by columns, the
   attention's and the MLP's output projections by rows (Megatron's split);
3. derived for the common shapes, in each block of the model's block list
   (:func:`~phalanx.parallel.blocks.find_blocks`): separate ``nn.Linear`` query, key and
   value projections (``q``/``k``/``v``, ``query``/``key``/``value``, ``q_proj``...,
   ``wq``...) by columns and their sibling output projection (``proj``, ``o``,
   ``o_proj``, ``out_proj``, ``c_proj``, ``wo``, ``dense``) by rows; an MLP (a module
   holding exactly two ``nn.Linear``, d -> h -> d) by columns, then rows. A fused q/k/v
   projection (nanoGPT's ``c_attn``) cannot be split by columns without re-ordering its
   heads: no plan is derived for it. A derived plan assumes what runs between a
   column-split layer and its row-split partner acts per feature or per head (GELU,
   dropout, attention over each head): a softmax or a norm across the hidden units would
   see one rank's share only; such a model declares its own plan.

:func:`check_plan` then splits a copy of the model as rank 0 of N would hold it and runs
its forward on a sample: a forward that takes its head count as a constant (not from the
projection's width) fails there, in the driver, in one line, not in N ranks.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from phalanx.errors import ConfigError
from phalanx.parallel.blocks import find_blocks

Plan = dict[str, dict[str, str]]
STYLES = ("colwise", "rowwise")
QKV = (("q", "k", "v"), ("query", "key", "value"), ("q_proj", "k_proj", "v_proj"),
       ("wq", "wk", "wv"))
OUT = ("proj", "o", "o_proj", "out_proj", "c_proj", "wo", "dense")
HOW = ("give the model a tensor_plan attribute ({block: {layer: 'colwise' | 'rowwise'}}, "
       "docs/workloads.md)")


def gpt_plan(model: nn.Module) -> Plan:
    """phalanx's GPT: every ``Block`` (its attention infers its heads from the width)."""
    plan = {}
    for name, module in model.named_modules():
        if type(module).__name__ == "Block" and type(module).__module__ == "phalanx.models.gpt":
            plan[name] = {"attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise",
                          "attn.proj": "rowwise", "mlp.fc": "colwise", "mlp.proj": "rowwise"}
    return plan


def _block_plan(block: nn.Module) -> dict[str, str]:
    linears = {n: m for n, m in block.named_modules() if isinstance(m, nn.Linear)}
    plan: dict[str, str] = {}
    parents: dict[str, list[str]] = {}
    for n in linears:
        parent, _, leaf = n.rpartition(".")
        parents.setdefault(parent, []).append(leaf)
    for parent, leaves in parents.items():
        pre = f"{parent}." if parent else ""
        for names in QKV:
            if set(names) <= set(leaves):
                outs = [o for o in OUT if o in leaves]
                if len(outs) == 1:
                    plan.update({f"{pre}{n}": "colwise" for n in names})
                    plan[f"{pre}{outs[0]}"] = "rowwise"
                break
        else:
            if len(leaves) == 2:  # an MLP: d -> h, then h -> d
                a, b = (linears[f"{pre}{leaf}"] for leaf in leaves)
                if a.out_features == b.in_features and a.in_features == b.out_features:
                    plan[f"{pre}{leaves[0]}"] = "colwise"
                    plan[f"{pre}{leaves[1]}"] = "rowwise"
    return plan


def derived_plan(model: nn.Module) -> Plan:
    found = find_blocks(model)
    if found is None:
        return {}
    name, blocks = found
    plan = {f"{name}.{i}": _block_plan(b) for i, b in enumerate(blocks)}
    return {k: v for k, v in plan.items() if v}


def tensor_plan(model: nn.Module) -> Plan:
    """The plan of the module's doc ({} if there is none)."""
    given = model.__dict__.get("tensor_plan")
    if given is not None:
        return given
    return gpt_plan(model) or derived_plan(model)


def check_plan(model: nn.Module, sample: torch.Tensor, world: int) -> Plan:
    """The model's plan, checked (one line naming what is wrong): a plan exists, names
    ``nn.Linear`` layers in the shape above whose split widths divide by ``world``, and
    the model split as one rank holds it still runs its forward on ``sample``."""
    plan = tensor_plan(model)
    what = f"--strategy tensor: the model ({type(model).__name__})"
    if not isinstance(plan, dict) or not plan or not all(
            isinstance(b, str) and isinstance(p, dict) and p
            and all(isinstance(k, str) and v in STYLES for k, v in p.items())
            for b, p in plan.items()):
        raise ConfigError(f"{what} has no tensor-parallel plan (phalanx's GPT has one; a "
                          "block of separate q/k/v projections and a two-layer MLP gets "
                          f"one derived); {HOW}")
    split = copy.deepcopy(model)
    for block, layers in plan.items():
        for name, style in layers.items():
            full = f"{block}.{name}"
            try:
                layer = split.get_submodule(full)
            except AttributeError:
                raise ConfigError(f"{what}: its tensor plan names {full}, not a module of "
                                  "it") from None
            if not isinstance(layer, nn.Linear):
                raise ConfigError(f"{what}: its tensor plan splits {full}, a "
                                  f"{type(layer).__name__}, not an nn.Linear")
            width = layer.out_features if style == "colwise" else layer.in_features
            if width % world:
                raise ConfigError(f"--workers: {world} ranks cannot share the {width} "
                                  f"{'columns' if style == 'colwise' else 'rows'} of {full} "
                                  "evenly")
            parent, _, leaf = full.rpartition(".")
            setattr(split.get_submodule(parent) if parent else split, leaf,
                    _one_rank(layer, style, world))
    try:
        with torch.no_grad():
            split(sample)
    except Exception as e:  # noqa: BLE001 - any failure of the split forward is one line
        first = (str(e).splitlines() or [""])[0][:160]
        raise ConfigError(f"{what}: its forward fails with its layers split over {world} "
                          f"ranks ({type(e).__name__}: {first}); its attention must take its "
                          "head count from the projections' width (view(B, T, -1, "
                          f"head_dim)), or {HOW}") from None
    return plan


def _one_rank(layer: nn.Linear, style: str, world: int) -> nn.Linear:
    """``layer`` as rank 0 of ``world`` holds it (a column or row slice)."""
    out, inp = layer.out_features, layer.in_features
    if style == "colwise":
        return nn.Linear(inp, out // world, bias=layer.bias is not None)
    return nn.Linear(inp // world, out, bias=layer.bias is not None)
