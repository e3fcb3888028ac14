"""Layer balancing: the cut minimises the bottleneck stage (checked against brute force)."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.errors import ConfigError
from phalanx.models import build_model
from phalanx.parallel.partition import (
    balance,
    check_stages,
    measure_layer_costs,
    parameter_costs,
    partition_model,
    stage_module,
)
from phalanx.parallel.stages import boundary_shapes, refuse_batchnorm_with_microbatches


def _brute_force(costs, parts):
    n = len(costs)
    best = None
    for cuts in itertools.combinations(range(1, n), parts - 1):
        edges = (0, *cuts, n)
        value = max(sum(costs[a:b]) for a, b in itertools.pairwise(edges))
        best = value if best is None else min(best, value)
    return best


@settings(max_examples=200, deadline=None)
@given(costs=st.lists(st.integers(0, 50), min_size=1, max_size=9), data=st.data())
def test_balance_is_optimal_contiguous_and_non_empty(costs, data):
    parts = data.draw(st.integers(1, len(costs)))
    sizes = balance(costs, parts)
    assert len(sizes) == parts and min(sizes) >= 1 and sum(sizes) == len(costs)
    edges = [0, *itertools.accumulate(sizes)]
    bottleneck = max(sum(costs[a:b]) for a, b in itertools.pairwise(edges))
    assert bottleneck == _brute_force(costs, parts)


def test_balance_refuses_more_parts_than_layers():
    with pytest.raises(ConfigError, match="cannot cut 2 layers into 3"):
        balance([1, 1], 3)


def test_mlp_partition_by_parameters_puts_the_big_layer_alone():
    model = build_model("mlp", (1, 16, 16), 10)
    costs = parameter_costs(model)
    assert costs[1] == 1 + 256 * 256 + 256  # fc1 dominates
    part = partition_model(model, 2)  # no sample: parameter counts
    assert part.source == "params"
    assert part.names == (("flatten", "fc1"), ("relu1", "fc2", "relu2", "fc3"))
    assert part.owner("fc3") == 1


def test_measured_partition_covers_every_layer_once():
    model = build_model("lenet5", (1, 16, 16), 10)
    sample = torch.randn(8, 1, 16, 16)
    costs = measure_layer_costs(model, sample, repeats=2)
    assert len(costs) == 12 and all(c > 0 for c in costs)
    part = partition_model(model, 3, sample)
    assert part.source == "time"
    flat = [n for names in part.names for n in names]
    assert flat == [n for n, _ in model.named_children()]
    # the stages chained equal the whole model, sharing its parameters
    x = torch.randn(4, 1, 16, 16)
    y = x
    for names in part.names:
        y = stage_module(model, names)(y)
    torch.testing.assert_close(y, model(x))
    shapes = boundary_shapes(model, part, (1, 16, 16), 4)
    assert shapes[-1] == (4, 10)


def test_check_stages_and_batchnorm_guard():
    with pytest.raises(ConfigError, match="--stages: 9 stages but the model has only 6 layers"):
        check_stages(build_model("mlp", (1, 16, 16), 10), 9, "--stages")
    resnet = build_model("resnet", (1, 16, 16), 10)
    refuse_batchnorm_with_microbatches(resnet, 1, "--microbatches")  # full batches: fine
    with pytest.raises(ConfigError, match="BatchNorm .* per micro-batch"):
        refuse_batchnorm_with_microbatches(resnet, 4, "--microbatches")
