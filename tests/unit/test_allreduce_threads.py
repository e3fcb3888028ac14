"""The allreduce classes' own code (ring, main node, native) on ranks that are threads: their
``torch.distributed`` calls go to an in-process point-to-point layer with gloo's matching
rule (per pair of ranks, in order, same size). The real-process oracle test is
tests/distributed/test_allreduce_dist.py; this one runs in a second, so it also serves the
mutation runs (``make mutate``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from threadgroup import on_threads

from phalanx.comm import allreduce as ar
from phalanx.comm.allreduce import ring_bytes


def _inputs(world: int, shape: tuple[int, ...]) -> list[torch.Tensor]:
    return [torch.randint(-1000, 1000, shape, generator=torch.Generator().manual_seed(r))
            .float() for r in range(world)]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("shape", [(0,), (1,), (2,), (7,), (5, 13)])
@pytest.mark.parametrize("name", ["ring", "main", "native"])
def test_sums_in_place_and_counts_bytes(monkeypatch, name: str, world: int,
                                        shape: tuple[int, ...]) -> None:
    xs = _inputs(world, shape)
    want = sum(xs[1:], xs[0].clone())

    def rank_main(rank: int):
        red = ar.make_allreduce(name)
        # a small segment: the ring cuts messages in pieces (both ends alike)
        if name == "ring":
            red.segment_bytes = 8
        x = xs[rank].clone()
        out = red(x)
        return out, x, red.counter.sent, red.counter.received

    results = on_threads(monkeypatch, world, rank_main)
    n, size = xs[0].numel(), 4
    for rank, (out, x, sent, received) in enumerate(results):
        assert out is x and torch.equal(x, want)  # in place, exact (integers)
        if name == "ring":
            assert sent == ring_bytes(n, size, world, rank)
            assert received == ring_bytes(n, size, world, (rank - 1) % world)
        elif name == "main":
            one = n * size if world > 1 else 0
            assert sent == received == (one * (world - 1) if rank == 0 else one)
        else:
            assert sent == received == ring_bytes(n, size, world, rank)


@pytest.mark.parametrize("name", ["ring", "main"])
def test_a_non_contiguous_tensor(monkeypatch, name: str) -> None:
    xs = [x.view(4, 6).t() for x in _inputs(3, (24,))]
    want = sum(xs[1:], xs[0].clone())

    def rank_main(rank: int):
        x = xs[rank].clone()  # keeps the transposed strides
        assert not x.is_contiguous()
        ar.make_allreduce(name)(x)
        return x

    for x in on_threads(monkeypatch, 3, rank_main):
        assert torch.equal(x, want)


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("name", ["ring", "main", "native"])
def test_all_gather(monkeypatch, name: str, world: int) -> None:
    xs = _inputs(world, (5,))

    def rank_main(rank: int):
        red = ar.make_allreduce(name)
        return red.all_gather(xs[rank]), red.counter.sent, red.counter.received

    for rank, (parts, sent, received) in enumerate(on_threads(monkeypatch, world, rank_main)):
        assert len(parts) == world
        assert all(torch.equal(p, x) for p, x in zip(parts, xs))
        size = 5 * 4
        if name == "main":
            want_sent = (size * world * (world - 1)) if rank == 0 else (size if world > 1 else 0)
            want_received = size * (world - 1) if rank == 0 else size * world
            assert (sent, received) == (want_sent, want_received if world > 1 else 0)
        else:
            assert sent == received == size * (world - 1)


@pytest.mark.parametrize("name", ["ring", "main", "native"])
def test_a_process_group_whose_ranks_are_not_the_global_ones(monkeypatch, name: str) -> None:
    """Every call names the group, and point-to-point calls take global ranks: group rank
    g is global rank ranks[g]."""
    group = SimpleNamespace(ranks=[2, 0, 1])
    xs = _inputs(3, (7,))
    want = sum(xs[1:], xs[0].clone())

    def rank_main(rank: int):
        counter = ar.ByteCounter()
        red = ar.make_allreduce(name, group=group, counter=counter)
        assert red.counter is counter
        x = xs[rank].clone()
        red(x)
        return x, red.all_gather(xs[rank]), counter.sent

    for x, parts, sent in on_threads(monkeypatch, 3, rank_main, group=group):
        assert torch.equal(x, want) and sent > 0
        # all_gather lists the tensors in group-rank order
        assert all(torch.equal(p, xs[g]) for p, g in zip(parts, group.ranks))


@pytest.mark.parametrize("name", ["ring", "main", "native"])
def test_int64_values_float32_cannot_hold(monkeypatch, name: str) -> None:
    xs = [torch.arange(9, dtype=torch.int64) * (2**40 + r) + r for r in range(3)]
    want = sum(xs[1:], xs[0].clone())

    def rank_main(rank: int):
        x = xs[rank].clone()
        ar.make_allreduce(name)(x)
        return x

    for x in on_threads(monkeypatch, 3, rank_main):
        assert x.dtype == torch.int64 and torch.equal(x, want)


def test_an_unknown_allreduce_is_one_line() -> None:
    with pytest.raises(ar.ConfigError) as e:
        ar.make_allreduce("tree")
    assert str(e.value) == "--allreduce: 'tree' is not one of ring, native, main"
