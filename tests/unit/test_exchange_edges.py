"""The exchange layer's edges: the bytes every compressor's group exchange moves under the
real allreduce classes (thread ranks) against :func:`mean_bytes`, the screen's boundaries
and counts, seeds and settings reaching the codecs, the single-rank and start-up paths, and
the summed counters. Written against the survivors of ``make mutate``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from threadgroup import on_threads, run_group

from phalanx.comm import allreduce as ar
from phalanx.comm import exchange
from phalanx.comm.compress import FP32_LIMIT, parse_compress
from phalanx.comm.exchange import (
    POWERSGD_LIMIT,
    Compression,
    NonFiniteGradients,
    Screened,
    all_gather_total,
    allreduce_total,
    group_screened,
    mean_bytes,
)
from phalanx.config import RunConfig

SHAPES = [torch.Size([8, 6]), torch.Size([6])]
N = 54


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("allreduce", ["ring", "native", "main"])
@pytest.mark.parametrize("text", ["none", "fp16", "bf16", "int8", "topk:0.1", "randk:0.2",
                                  "powersgd:2", "powersgd:1,start=1"])
def test_group_bytes_equal_the_formula(monkeypatch, text: str, allreduce: str,
                                       world: int) -> None:
    spec = parse_compress(text)

    def rank_main(rank: int):
        red = ar.make_allreduce(allreduce)
        comp = Compression(spec, seed=3)
        sent = []
        for step in range(2):
            before = red.counter.sent
            flat = torch.randn(N, generator=torch.Generator().manual_seed(rank + 10 * step))
            comp.mean_(flat, SHAPES, red, world, key=0)
            sent.append(red.counter.sent - before)
        return sent

    per_rank = on_threads(monkeypatch, world, rank_main)
    for step in range(2):
        got = sum(r[step] for r in per_rank)
        assert got == mean_bytes(spec, SHAPES, world, allreduce, step), (text, step)


def test_traffic_formulas() -> None:
    assert [allreduce_total(10, w) for w in (1, 2, 3)] == [0, 20, 40]
    assert allreduce_total(0, 3) == 0
    assert [all_gather_total(10, w, "ring") for w in (1, 2, 3)] == [0, 20, 60]
    assert [all_gather_total(10, w, "main") for w in (1, 2, 3)] == [0, 30, 80]


def test_the_screen_boundaries_and_counts() -> None:
    comp = Compression(parse_compress("fp16"))
    lim = comp.codec.limit
    y, c = comp.screen(0, torch.tensor([lim, -lim, 1.0]), lim)
    assert c is y and comp.screened == Screened()  # at the limit: nothing to clip
    y, c = comp.screen(1, torch.tensor([-2 * lim, 1.0, lim]), lim)
    assert c.tolist() == [-lim, 1.0, lim] and y[0] == -2 * lim
    assert comp.screened == Screened(0, 1, 1)
    comp.screen(2, torch.tensor([3 * lim, -3 * lim, 0.0]), lim)
    assert comp.screened == Screened(0, 2, 3)
    y, c = comp.screen(3, torch.zeros(0), lim)
    assert y.numel() == 0 and comp.screened == Screened(0, 2, 3)
    y, c = comp.screen(4, torch.tensor([float("nan"), 1.0]), lim)
    assert y is None and torch.equal(c, torch.zeros(2)) and comp.screened.skipped == 1


def test_encode_clips_before_the_codec_and_passes_the_seed() -> None:
    int8 = Compression(parse_compress("int8"))
    t = int8.encode(torch.tensor([-3e38, 1.0]), key=0)
    assert int8.codec.decode(t, 2)[0] == pytest.approx(-FP32_LIMIT, rel=1e-6)
    assert int8.feedback.residual[0][0] == pytest.approx(-3e38 + FP32_LIMIT, rel=1e-6)
    randk = Compression(parse_compress("randk:0.5"))
    assert int(randk.encode(torch.arange(6.0), key=0, seed=7)[0]) == 7
    assert int(randk.encode(torch.arange(6.0), key=1)[0]) == 0
    assert int8.encode(torch.zeros(0), key=2).numel() == 4
    assert int8.limit == FP32_LIMIT
    assert Compression(parse_compress("powersgd:2")).limit == POWERSGD_LIMIT


def test_settings_reach_the_codecs() -> None:
    cfg = RunConfig(compress="powersgd:2,start=3,warm", seed=9, lr=0.5, rule="adam",
                    error_feedback=False)
    comp = Compression.from_config(cfg)
    p = comp.powersgd
    assert (p.rank, p.start, p.warm, comp.seed) == (2, 3, True, 9)
    assert p.rng.randint(10**9) == np.random.RandomState(9).randint(10**9)
    assert not comp.feedback.enabled and comp.codec is None and comp.active
    assert comp.lr_hint == " (--lr 0.5 with --rule adam)"
    assert Compression(parse_compress("int8")).feedback.enabled  # on by default
    assert Compression(parse_compress("int8")).seed == 0
    assert Compression(parse_compress("int8")).lr_hint == ""
    assert not Compression(parse_compress("none")).active
    assert Compression(parse_compress("fp16")).flags == 1 << 3


@pytest.mark.parametrize("key,what", [(0, "bucket 0 of the gradient"),
                                      ("parameter delta", "the parameter delta")])
def test_the_streak_message_names_the_key(key, what: str) -> None:
    comp = Compression.from_config(RunConfig(compress="topk:0.5", lr=0.1, rule="sgd"))
    flat = torch.tensor([float("inf"), 1.0])

    def rank_main(rank, allreduce):
        for _ in range(exchange.SKIP_STREAK):
            comp.mean_(flat.clone(), [torch.Size([2])], allreduce, 2, key)

    with pytest.raises(NonFiniteGradients) as e:
        run_group(2, lambda r, a: rank_main(r, a) if r == 0 else _zeros(a))
    assert str(e.value) == (
        f"training diverged: {what} held NaN or inf in 10 messages in a row; --compress "
        "topk:0.5 skipped each one (counted; the error-feedback residual is intact), so "
        "nothing was learnt: the learning rate (--lr 0.1 with --rule sgd) is probably too "
        "high, or the data holds non-finite values")


def _zeros(allreduce) -> None:
    comp = Compression(parse_compress("topk:0.5"))
    for _ in range(exchange.SKIP_STREAK):
        comp.mean_(torch.zeros(2), [torch.Size([2])], allreduce, 2, 0)


def test_one_rank_is_exact_and_uncompressed() -> None:
    x = torch.randn(N)

    def rank_main(rank, allreduce):
        comp = Compression(parse_compress("topk:0.1"))
        flat = x.clone()
        out = comp.mean_(flat, SHAPES, allreduce, 1, key=0)
        return out, flat, allreduce.calls, comp.feedback.residual

    out, flat, calls, residual = run_group(1, rank_main)[0]
    assert out is flat and torch.equal(flat, x) and calls == 1 and residual == {}


def test_powersgd_start_up_has_no_error_and_compression_then_does() -> None:
    xs = [[torch.randn(N, generator=torch.Generator().manual_seed(10 * r + s))
           for s in range(2)] for r in range(2)]

    def rank_main(rank, allreduce):
        comp = Compression(parse_compress("powersgd:1,start=1"))
        out = []
        for x in xs[rank]:
            comp.mean_(x.clone(), SHAPES, allreduce, 2, key=0)
            out.append(comp.feedback.residual[0].clone())
        return out

    for res in run_group(2, rank_main):
        assert torch.equal(res[0], torch.zeros(N))  # a plain step drops nothing
        assert res[1].abs().max() > 1e-3  # a rank-1 approximation does


def test_randk_draws_new_shared_indices_every_call() -> None:
    def rank_main(rank, allreduce):
        comp = Compression(parse_compress("randk:0.2"), seed=1)
        return [comp.mean_(torch.ones(N) * (rank + 1), SHAPES, allreduce, 2, 0) != 0
                for _ in range(3)]

    a, b = run_group(2, rank_main)
    assert all(torch.equal(x, y) for x, y in zip(a, b))  # the same indices on every rank
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[1], a[2])
    other = run_group(2, lambda r, ar_: Compression(parse_compress("randk:0.2"), seed=2)
                      .mean_(torch.ones(N), SHAPES, ar_, 2, 0) != 0)
    assert not torch.equal(other[0], a[0])  # the seed picks them


def test_group_screened_sums_every_rank(monkeypatch) -> None:
    assert group_screened(None) == Screened()
    inactive = Compression(parse_compress("none"))
    inactive.screened = Screened(1, 1, 1)
    assert group_screened(inactive) == Screened()  # no collective without compression
    comp = Compression(parse_compress("int8"))
    comp.screened = Screened(1, 2, 5)
    monkeypatch.setattr(exchange.dist, "is_initialized", lambda: False)
    assert group_screened(comp) == Screened(1, 2, 5)

    def rank_main(rank: int):
        c = Compression(parse_compress("int8"))
        c.screened = Screened(rank, 1, 10 * rank)
        return group_screened(c)

    for world in (2, 3):
        want = Screened(sum(range(world)), world, 10 * sum(range(world)))
        assert on_threads(monkeypatch, world, rank_main, (exchange,)) == [want] * world
    alone = on_threads(monkeypatch, 1, lambda r: group_screened(comp), (exchange,))
    assert alone == [Screened(1, 2, 5)]


def test_group_limits() -> None:
    fp16, int8 = Compression(parse_compress("fp16")), Compression(parse_compress("int8"))
    assert fp16.group_limit(2) == 65504 / (1 + 2 / 1024)
    assert fp16.group_limit(8) == 65504 / (1 + 8 / 1024)
    bf16 = Compression(parse_compress("bf16"))
    assert bf16.group_limit(2) == torch.finfo(torch.bfloat16).max / (1 + 2 / 128)
    assert int8.group_limit(2) == 2.0**126 and int8.group_limit(4) == 2.0**125
    assert Compression(parse_compress("powersgd:1")).group_limit(2) == POWERSGD_LIMIT


def test_factories_and_defaults() -> None:
    assert exchange.compression_for(RunConfig()) is None
    assert exchange.pull_deltas_for(RunConfig()) is None
    assert exchange.compression_for(RunConfig(compress="int8")).active
    assert exchange.pull_deltas_for(RunConfig(compress="int8")).codec.name == "int8"
    spec = parse_compress("powersgd:2,start=1")
    assert mean_bytes(spec, SHAPES, 2, "ring") == allreduce_total(4 * N, 2)  # step 0: raw
    assert mean_bytes(parse_compress("bf16"), SHAPES, 2, "ring") == allreduce_total(2 * N, 2)


def test_the_streak_message_without_a_name_and_for_a_shard() -> None:
    comp = Compression(parse_compress("int8"))
    for _ in range(exchange.SKIP_STREAK - 1):
        comp.screen("k", torch.tensor([float("nan")]), 1.0)
    with pytest.raises(NonFiniteGradients, match=r"^training diverged: 'k' held NaN"):
        comp.screen("k", torch.tensor([float("nan")]), 1.0)
    for _ in range(exchange.SKIP_STREAK - 1):
        comp.encode(torch.tensor([float("nan")]), key=3)
    with pytest.raises(NonFiniteGradients, match=r"^training diverged: the gradient for "
                                                 r"shard 3 held NaN or inf in 10 messages"):
        comp.encode(torch.tensor([float("nan")]), key=3)


def test_randk_buckets_draw_their_own_indices() -> None:
    def rank_main(rank, allreduce):
        comp = Compression(parse_compress("randk:0.2"), seed=1)
        return [comp.mean_(torch.ones(N), SHAPES, allreduce, 2, key) != 0 for key in (0, 1)]

    (a0, a1), (b0, b1) = run_group(2, rank_main)
    assert torch.equal(a0, b0) and torch.equal(a1, b1) and not torch.equal(a0, a1)
