"""Column-parallel Linear: the split computation equals the unsplit layer (one process)."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from phalanx.errors import ConfigError
from phalanx.models import build_model
from phalanx.parallel.column_parallel import (
    check_split_layer,
    column_parallel_forward,
    shard_bounds,
    split_linear,
)


@given(features=st.integers(1, 40), world=st.integers(1, 8))
def test_shard_bounds_tile_the_features(features, world):
    if world > features:
        with pytest.raises(ValueError):
            shard_bounds(features, world)
        return
    bounds = shard_bounds(features, world)
    assert bounds[0][0] == 0 and bounds[-1][1] == features
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    sizes = [hi - lo for lo, hi in bounds]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 6), fin=st.integers(1, 12), fout=st.integers(1, 12),
       world=st.integers(1, 4), bias=st.booleans(), seed=st.integers(0, 10_000))
def test_split_equals_unsplit_forward_and_backward(batch, fin, fout, world, bias, seed):
    world = min(world, fout)
    torch.manual_seed(seed)
    full = nn.Linear(fin, fout, bias=bias).double()
    shards = [s.double() for s in split_linear(full, world)]
    x = torch.randn(batch, fin, dtype=torch.float64)
    g = torch.randn(batch, fout, dtype=torch.float64)  # an arbitrary upstream gradient

    x_full = x.clone().requires_grad_(True)
    y_full = full(x_full)
    (y_full * g).sum().backward()

    x_split = x.clone().requires_grad_(True)
    y_split = column_parallel_forward(x_split, shards)
    (y_split * g).sum().backward()

    torch.testing.assert_close(y_split, y_full)
    # d loss / d x is the SUM of every shard's contribution: what the all-reduce computes
    torch.testing.assert_close(x_split.grad, x_full.grad)
    for s, (lo, hi) in zip(shards, shard_bounds(fout, world)):
        torch.testing.assert_close(s.weight.grad, full.weight.grad[lo:hi])
        if bias:
            torch.testing.assert_close(s.bias.grad, full.bias.grad[lo:hi])


def test_check_split_layer_refuses_bad_names():
    model = build_model("mlp", (1, 16, 16), 10)
    assert check_split_layer(model, "fc1", 2) is model.fc1
    with pytest.raises(ConfigError, match="no layer 'nope'"):
        check_split_layer(model, "nope", 2)
    with pytest.raises(ConfigError, match="not nn.Linear"):
        check_split_layer(model, "relu1", 2)
    with pytest.raises(ConfigError, match="fewer than --workers 11"):
        check_split_layer(model, "fc3", 11)
