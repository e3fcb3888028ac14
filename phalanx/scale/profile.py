"""``--profile-here``: a phalanx model's workload measured on this machine (the only module of
``phalanx.scale`` that imports torch).

Parameters come from the model itself (one layer per parameter tensor, registration order:
what the buckets of ``comm/bucketing.py`` see). The step's compute is the median of timed
forward + backward passes at the batch on random inputs of the model's own task; each
layer's share of it is its share of the parameters (an assumption, labelled in ``notes``:
per-layer timing hooks would cost more than the MLP's whole step).
"""

from __future__ import annotations

import functools
import statistics
import time

import torch

from phalanx.data.ctr import ZIPF_S, vocab_sizes
from phalanx.errors import ConfigError
from phalanx.models import MODELS, build_model
from phalanx.models.zoo import MODEL_TASKS
from phalanx.parallel.partition import (
    Partition,
    balance,
    check_stages,
    layers_of,
    measure_layer_costs,
    parameter_costs,
)
from phalanx.parallel.stages import boundary_shapes
from phalanx.parallel.zero_units import unit_modules
from phalanx.scale.workload import Layer, Sparse, Workload

# the input each task's models are built for (as `phalanx models` counts them)
INPUTS = {"classify": ((1, 28, 28), 10, {}), "lm": ((64,), 65, {}),
          "ctr": ((39,), 2, {"dense": 13})}


def _batch(task: str, shape: tuple[int, ...], classes: int, batch: int) -> torch.Tensor:
    if task == "lm":
        return torch.randint(0, classes, (batch, *shape))
    if task == "ctr":
        dense = torch.randn(batch, 13)
        ids = torch.randint(0, 1000, (batch, shape[0] - 13)).float()
        return torch.cat([dense, ids], dim=1)
    return torch.randn(batch, *shape)


def _build(name: str, input_shape: tuple[int, ...] | None, options: dict | None
           ) -> tuple[str, tuple[int, ...], int, torch.nn.Module]:
    """(task, input shape, classes, model) of ``name`` as phalanx builds it for its task's
    input (or ``input_shape``), seeded."""
    task = MODEL_TASKS.get(name, "classify")
    shape, classes, defaults = INPUTS[task]
    shape = input_shape or shape
    torch.manual_seed(0)
    model = build_model(name, shape, classes, **{**defaults, **(options or {})})
    return task, shape, classes, model


def _units(model: torch.nn.Module) -> dict[str, str]:
    """Parameter name -> the ZeRO-3 unit phalanx's stage 3 gathers it with
    (``parallel/zero_units.py``); parameters of no unit module are the root's."""
    out = {}
    for unit, module in unit_modules(model):
        for n, _ in module.named_parameters():
            out.setdefault(f"{unit}.{n}", unit)
    return out


def _stage_split(model: torch.nn.Module, part: Partition, shape: tuple[int, ...],
                 dtype: torch.dtype) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """(bytes per sample at each cut, trainable parameters of each stage) of ``model`` cut
    as ``part``."""
    shapes = boundary_shapes(model, part, shape, 1, dtype=dtype)[:-1]
    modules = dict(layers_of(model))
    params = tuple(sum(p.numel() for n in names for p in modules[n].parameters()
                       if p.requires_grad) for names in part.names)
    return tuple(float(torch.Size(sh[1:]).numel() * 4) for sh in shapes), params


def _cut_bytes(model: torch.nn.Module, x: torch.Tensor, most: int = 8
               ) -> tuple[tuple[tuple[float, ...], ...], tuple[tuple[int, ...], ...]]:
    """Bytes per sample at each cut, and each stage's parameters, where phalanx's
    model-parallel and pipeline strategies cut ``model`` into P = 2 .. ``most`` stages
    (``parallel/partition.py``: balanced by the layers' times on ``x``, as a run's rank 0
    measures them; where layers cost alike the cut can move from run to run, so the checks
    take the cut each run reports). Empty where the model cannot be cut."""
    try:
        layers = [name for name, _ in layers_of(model)]
        check_stages(model, 2, "--stages")
    except ConfigError:
        return (), ()
    try:
        costs = measure_layer_costs(model, x)
    except RuntimeError:   # as partition_model: a layer that cannot run alone
        costs = parameter_costs(model)
    cuts, params = [], []
    for parts in range(2, min(most, len(layers)) + 1):
        names, start = [], 0
        for size in balance(costs, parts):
            names.append(tuple(layers[start:start + size]))
            start += size
        c, k = _stage_split(model, Partition(tuple(names), (0.0,) * parts, "time"),
                            tuple(x.shape[1:]), x.dtype)
        cuts.append(c)
        params.append(k)
    return tuple(cuts), tuple(params)


@functools.cache
def layer_count(name: str, input_shape: tuple[int, ...] | None = None) -> int:
    """How many stages phalanx can cut ``name`` into (``parallel/partition.layers_of``:
    the MLP 6, the default GPT 7): a pipeline or model-parallel run of more stages is
    refused."""
    return len(layers_of(_build(name, input_shape, None)[3]))


def cuts_of(name: str, stages: list[list[str]], input_shape: tuple[int, ...],
            options: dict | None = None) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """(bytes per sample at each cut, each stage's parameters) of ``name`` split into
    ``stages`` (a run's ``partition``: the layer names of each stage, as its summary
    reports them)."""
    task, _, _, model = _build(name, input_shape, options)
    part = Partition(tuple(tuple(s) for s in stages), (0.0,) * len(stages), "run")
    dtype = torch.int64 if task == "lm" else torch.float32
    return _stage_split(model, part, tuple(input_shape), dtype)


def profile_model(name: str, batch: int, repeats: int = 7, threads: int = 1,
                  input_shape: tuple[int, ...] | None = None,
                  options: dict | None = None, data_seed: int | None = None) -> Workload:
    """Build ``name`` and time its forward + backward at ``batch`` here (its task's input,
    or ``input_shape``: ``--data synthetic``'s 1x16x16 makes a smaller MLP; ``options``:
    the model's own, e.g. the CTR table's ``rows``). ``data_seed``: the CTR table's traffic
    follows ``--data ctr-synthetic``'s vocabularies for that seed."""
    if name not in MODELS.names():
        raise ConfigError(f"--model: {name!r} is not a phalanx model "
                          f"({', '.join(MODELS.names())})")
    if not 1 <= batch <= 65536:
        raise ConfigError(f"--batch: {batch} is not in 1..65536")
    task, shape, classes, model = _build(name, input_shape, options)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = _batch(task, shape, classes, batch)
        times = []
        for i in range(repeats + 1):
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            out = model(x)
            out.float().square().mean().backward()
            if i:  # the first pass allocates and warms caches
                times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(old)
    params = [(n, p.numel()) for n, p in model.named_parameters() if p.requires_grad]
    total = sum(n for _, n in params)
    unit = _units(model)
    layers = tuple(Layer(name=n, params=k, compute_share=k / total,
                         unit=unit.get(n, "root")) for n, k in params)
    # activations at a cut (pipeline sends, tensor-parallel allreduces), per sample: a
    # transformer's context x width at every block; otherwise the widest Linear's input
    # (an approximation, labelled in notes)
    blocks = [m for n, m in model.named_children() if type(m).__name__ == "Block"]
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if blocks and linears:
        activation = shape[0] * linears[-1].in_features * 4
    else:
        activation = max((m.in_features for m in linears), default=0) * 4
    cuts, stage_params = _cut_bytes(model, x)
    sparse = None
    if task == "ctr":
        emb = model.embed
        vocab = vocab_sizes(data_seed, emb.fields) if data_seed is not None else ()
        sparse = Sparse(rows=emb.weight.shape[0], dim=emb.weight.shape[1], zipf_s=ZIPF_S,
                        lookups=emb.fields, vocab=vocab, field_rows=emb.field_rows)
    return Workload(name=name, layers=layers, batch=batch,
                    step_compute_s=statistics.median(times), sparse=sparse,
                    activation_bytes=float(activation), tp_layers=len(blocks),
                    cut_bytes=cuts, stage_params=stage_params,
                    compute_source=f"profile: median of {repeats} passes here, "
                                   f"{threads} thread(s)",
                    notes="per-layer compute split by parameter share; activation bytes "
                          "at a cut: context x width (transformer) or the widest Linear "
                          "input (assumed)")
