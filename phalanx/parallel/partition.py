"""Layer balancing for model and pipeline parallelism.

A model is an ``nn.Sequential`` of named top-level layers. :func:`balance` cuts the layer
list into ``parts`` contiguous, non-empty stages so that the most expensive stage (the
pipeline's bottleneck) is as cheap as possible. Costs are measured per layer (forward +
backward wall time on a sample batch, :func:`measure_layer_costs`); where that cannot be
measured the parameter count stands in (:func:`parameter_costs`).

Measured times differ between processes, so one process measures and broadcasts the cut
(:func:`agreed_partition`); every stage then builds the same split.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from phalanx.errors import ConfigError
from phalanx.parallel.blocks import BlockView, cut_between_children, shared_parameters


@dataclass(frozen=True)
class Partition:
    """Layer names per stage, the cost each stage carries and what the costs measured."""

    names: tuple[tuple[str, ...], ...]
    costs: tuple[float, ...]
    source: str  # "time" (measured seconds) or "params" (parameter count)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(n) for n in self.names)

    def owner(self, layer: str) -> int:
        for stage, names in enumerate(self.names):
            if layer in names:
                return stage
        raise KeyError(layer)


def layers_of(model: nn.Module, what: str = "--strategy") -> list[tuple[str, nn.Module]]:
    """The named layers a stage is cut from: a sequential model's top-level children, or
    a block model's ``pre``, blocks and ``post`` (:mod:`phalanx.parallel.blocks`)."""
    if cut_between_children(model):
        return list(model.named_children())
    try:
        return BlockView(model).layers
    except ValueError:
        raise ConfigError(f"{what}: needs an nn.Sequential model (of named layers) or a model "
                          f"with a ModuleList of blocks to cut into stages, got "
                          f"{type(model).__name__}") from None


def layer_keys(model: nn.Module, names: Sequence[str]) -> list[str]:
    """State-dict keys (parameters and buffers) of the layers ``names`` of ``model``."""
    state = list(model.state_dict())
    if cut_between_children(model):
        prefixes = tuple(f"{n}." for n in names)
        return [k for k in state if k.startswith(prefixes)]
    view = BlockView(model)
    return [k for n in names for k in view.keys(state, n)]


def check_stages(model: nn.Module, parts: int, flag: str) -> None:
    """Refuse, before any process starts, a stage count the model cannot be cut into, and
    weights two layers share (tied embeddings: each stage would update its own copy)."""
    layers = layers_of(model, flag)
    if parts > len(layers):
        raise ConfigError(f"{flag}: {parts} stages but the model has only {len(layers)} layers "
                          f"({', '.join(n for n, _ in layers)})")
    shared = shared_parameters(layers)
    if shared and parts > 1:
        a, b = shared[0]
        raise ConfigError(f"{flag}: layers {a} and {b} share a parameter (tied weights, e.g. "
                          "input and output embeddings); stages would train separate copies. "
                          "Untie them or use a data-parallel strategy")


def balance(costs: Sequence[float], parts: int) -> list[int]:
    """Sizes of ``parts`` contiguous non-empty groups of ``costs`` minimising the largest
    group sum (ties: the earliest cut that achieves the optimum, deterministic)."""
    n = len(costs)
    if not 1 <= parts <= n:
        raise ConfigError(f"cannot cut {n} layers into {parts} non-empty stages")
    if any(not (c >= 0) for c in costs):
        raise ValueError(f"layer costs must be >= 0, got {list(costs)}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    inf = float("inf")
    # best[k][i]: smallest bottleneck cutting the first i layers into k groups
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n - (parts - k) + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i] - 1e-12 * max(1.0, abs(value)):
                    best[k][i], cut[k][i] = value, j
    sizes, i = [], n
    for k in range(parts, 0, -1):
        j = cut[k][i]
        sizes.append(i - j)
        i = j
    return sizes[::-1]


def parameter_costs(model: nn.Module) -> list[float]:
    """Parameter count per top-level layer (+1 so parameter-free layers still weigh)."""
    return [1.0 + sum(p.numel() for p in layer.parameters()) for _, layer in layers_of(model)]


def measure_layer_costs(model: nn.Module, sample: torch.Tensor, repeats: int = 3) -> list[float]:
    """Median forward + backward seconds of each top-level layer on ``sample``.

    Runs on a copy so BatchNorm running statistics of ``model`` are not touched.
    """
    import copy
    import statistics

    layers = layers_of(copy.deepcopy(model))
    times: list[list[float]] = [[] for _ in layers]
    for _ in range(repeats + 1):  # the first pass warms up allocators and is discarded
        x = sample
        for i, (_, layer) in enumerate(layers):
            x = x.detach().requires_grad_(x.is_floating_point())
            t = time.perf_counter()
            y = layer(x)
            if y.requires_grad:
                y.backward(torch.ones_like(y))
            times[i].append(time.perf_counter() - t)
            x = y
    return [statistics.median(t[1:]) for t in times]


def partition_model(model: nn.Module, parts: int, sample: torch.Tensor | None = None) -> Partition:
    """Cut ``model`` into ``parts`` stages balanced by measured time (parameter count when
    there is no sample or measuring fails)."""
    check_stages(model, parts, "--stages")
    layers = layers_of(model)
    costs, source = None, "params"
    if sample is not None:
        try:
            costs, source = measure_layer_costs(model, sample), "time"
        except RuntimeError:  # a layer that cannot run alone: fall back to parameter count
            costs = None
    if costs is None:
        costs, source = parameter_costs(model), "params"
    sizes = balance(costs, parts)
    names, stage_costs, start = [], [], 0
    for size in sizes:
        names.append(tuple(n for n, _ in layers[start:start + size]))
        stage_costs.append(float(sum(costs[start:start + size])))
        start += size
    return Partition(tuple(names), tuple(stage_costs), source)


def agreed_partition(model: nn.Module, parts: int, sample: torch.Tensor | None,
                     src: int = 0) -> Partition:
    """:func:`partition_model` measured on rank ``src`` and broadcast, so every process
    cuts the model the same way even though each would time it differently."""
    layers = layers_of(model)
    msg = torch.zeros(parts + 1, dtype=torch.int64)
    costs = torch.zeros(parts, dtype=torch.float64)
    if dist.get_rank() == src:
        part = partition_model(model, parts, sample)
        msg[:parts] = torch.tensor(part.sizes)
        msg[parts] = 1 if part.source == "time" else 0
        costs[:] = torch.tensor(part.costs, dtype=torch.float64)
    # sync point: every stage waits for the measuring rank's cut
    dist.broadcast(msg, src)
    dist.broadcast(costs, src)
    sizes = msg[:parts].tolist()
    if sum(sizes) != len(layers) or min(sizes) < 1:
        raise ConfigError(f"partition from rank {src} does not fit this model: sizes {sizes}")
    names, start = [], 0
    for size in sizes:
        names.append(tuple(n for n, _ in layers[start:start + size]))
        start += size
    return Partition(tuple(names), tuple(costs.tolist()), "time" if msg[parts] else "params")


def stage_module(model: nn.Module, names: Sequence[str]) -> nn.Sequential:
    """The layers ``names`` of ``model`` as one sequential stage (sharing their parameters)."""
    children = dict(layers_of(model))
    from collections import OrderedDict

    return nn.Sequential(OrderedDict((n, children[n]) for n in names))
