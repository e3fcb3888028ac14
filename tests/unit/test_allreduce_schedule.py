"""The ring's chunk arithmetic and schedule, run on virtual ranks in one process."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.comm.allreduce import (
    chunk_bounds,
    make_allreduce,
    ring_bytes,
    ring_schedule,
    simulate_ring,
)
from phalanx.errors import ConfigError


@given(numel=st.integers(0, 5000), world=st.integers(1, 16))
def test_chunks_cover_the_tensor_and_differ_by_at_most_one(numel: int, world: int) -> None:
    bounds = chunk_bounds(numel, world)
    assert len(bounds) == world
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    sizes = [hi - lo for lo, hi in bounds]
    assert max(sizes) - min(sizes) <= 1


@given(world=st.integers(1, 12))
def test_each_rank_receives_what_its_left_neighbour_sends(world: int) -> None:
    for rank in range(world):
        mine, left = ring_schedule(world, rank), ring_schedule(world, (rank - 1) % world)
        assert len(mine) == 2 * (world - 1)
        for a, b in zip(mine, left):
            assert a.recv_chunk == b.send_chunk and a.phase == b.phase
        # the reduce-scatter leaves rank r owning chunk (r+1) % N: it never sends that one
        sent = {s.send_chunk for s in mine if s.phase == "reduce-scatter"}
        assert (rank + 1) % world not in sent
        # the all-gather brings every other finished chunk exactly once
        got = [s.recv_chunk for s in mine if s.phase == "all-gather"]
        assert sorted(got) == sorted(set(range(world)) - {(rank + 1) % world})


@settings(max_examples=60, deadline=None)
@given(world=st.integers(1, 8), shape=st.lists(st.integers(0, 9), min_size=0, max_size=3),
       seed=st.integers(0, 2**31 - 1))
def test_simulated_ring_sums_exactly(world: int, shape: list[int], seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    # small integers in float64: every summation order gives the same, exact result
    tensors = [torch.randint(-1000, 1000, shape, generator=g).double() for _ in range(world)]
    expected = torch.stack(tensors).sum(0) if tensors[0].numel() else tensors[0]
    for out in simulate_ring(tensors):
        assert out.shape == tensors[0].shape
        assert torch.equal(out, expected)


@pytest.mark.parametrize("numel,world", [(1000, 4), (1024, 2), (7, 3), (2, 4), (0, 3), (5, 1),
                                         (1, 2), (3, 4), (11, 5)])
def test_ring_bytes_sum_to_2x_n_minus_1(numel: int, world: int) -> None:
    per_rank = [ring_bytes(numel, 4, world, r) for r in range(world)]
    bounds = chunk_bounds(numel, world)
    for rank in range(world):  # what the schedule sends, chunk by chunk
        sent = sum(bounds[s.send_chunk][1] - bounds[s.send_chunk][0]
                   for s in ring_schedule(world, rank))
        assert per_rank[rank] == 4 * sent
    assert sum(per_rank) == 2 * numel * 4 * (world - 1)
    if numel % world == 0:
        assert per_rank == [2 * numel * 4 * (world - 1) // world] * world


def test_unknown_allreduce_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--allreduce"):
        make_allreduce("tree")
