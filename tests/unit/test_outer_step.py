"""The averaging round (:class:`OuterSync`) by value on a group of threads: SGD at lr 1 lands
on the plain average, Nesterov's outer step is the formula, a compressed round moves every
replica by the mean of the compressed deltas, and a rank whose delta went non-finite is
skipped (and brought back to the common weights)."""

from __future__ import annotations

import pytest
import torch
from threadgroup import run_group

from phalanx.config import RunConfig
from phalanx.parallel.outer_step import OuterSync, outer_rule

WORLD = 2


def _weights(rank: int, step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(10 * rank + step)
    return [torch.randn(4, 3, generator=g), torch.randn(3, generator=g),
            torch.randn(2, 5, generator=g)]


def _rounds(cfg: RunConfig, rounds: int, poison: tuple[int, int] | None = None):
    """Each rank: start equal, then per round move to its own new weights and sync.
    Returns per rank the weights after every round."""
    start = _weights(0, 0)

    def rank_main(rank, allreduce):
        weights = [w.clone() for w in start]
        sync = OuterSync(cfg, weights, allreduce, WORLD)
        after = []
        for r in range(1, rounds + 1):
            for w, new in zip(weights, _weights(rank, r)):
                w.copy_(new)
            if poison == (rank, r):
                weights[1][0] = float("nan")
            sync.sync(weights)
            after.append([w.clone() for w in weights])
        return after, sync

    return start, run_group(WORLD, rank_main)


def _mean(rank_weights: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    return [sum(ws) / len(ws) for ws in zip(*rank_weights)]


def test_sgd_at_lr_1_is_the_average_and_nesterov_is_its_formula() -> None:
    assert not OuterSync.wanted(RunConfig())
    assert OuterSync.wanted(RunConfig(outer_rule="sgd")) and OuterSync.wanted(
        RunConfig(compress="int8"))
    _, out = _rounds(RunConfig(outer_rule="sgd", outer_lr=1.0), 2)
    for r in range(2):
        want = _mean([_weights(rank, r + 1) for rank in range(WORLD)])
        for rank in range(WORLD):
            for got, w in zip(out[rank][0][r], want):
                assert torch.allclose(got, w, atol=1e-6)
    lr, mu = 0.7, 0.5
    start, out = _rounds(RunConfig(outer_rule="nesterov", outer_lr=lr, outer_momentum=mu), 2)
    anchor, buf = [w.clone() for w in start], [torch.zeros_like(w) for w in start]
    for r in range(2):
        avg = _mean([_weights(rank, r + 1) for rank in range(WORLD)])
        for i, (a, m) in enumerate(zip(anchor, avg)):
            g = a - m  # the pseudo-gradient
            buf[i] = mu * buf[i] + g
            anchor[i] = a - lr * (g + mu * buf[i])
        for got, w in zip(out[0][0][r], anchor):
            assert torch.allclose(got, w, atol=1e-5)
    assert outer_rule(RunConfig()) is not None


def test_outer_sgd_steps_by_its_lr_and_plain_rounds_ignore_it() -> None:
    start, out = _rounds(RunConfig(outer_rule="sgd", outer_lr=0.5), 1)
    avg = _mean([_weights(rank, 1) for rank in range(WORLD)])
    for got, a, m in zip(out[0][0][0], start, avg):
        assert torch.allclose(got, a - 0.5 * (a - m), atol=1e-6)
    # --outer-lr without --outer-rule: a plain (compressed) average, lr 1
    _, out = _rounds(RunConfig(compress="fp16", outer_lr=0.5), 1)
    for got, m in zip(out[0][0][0], avg):
        assert torch.allclose(got, m, atol=1e-2)


def test_a_powersgd_round_reads_the_shapes() -> None:
    _, out = _rounds(RunConfig(compress="powersgd:4"), 1)
    avg = _mean([_weights(rank, 1) for rank in range(WORLD)])
    for got, m in zip(out[0][0][0], avg):  # rank 4 >= every matrix's rank here: exact
        assert torch.allclose(got, m, atol=1e-5)


@pytest.mark.parametrize("compress", ["int8", "topk:0.5", "fp16"])
def test_a_compressed_round_moves_every_replica_by_the_mean_delta(compress: str) -> None:
    start, out = _rounds(RunConfig(compress=compress), 1)
    want = _mean([_weights(rank, 1) for rank in range(WORLD)])
    for rank in range(WORLD):
        got = out[rank][0][0]
        assert all(torch.equal(a, b) for a, b in zip(got, out[0][0][0]))  # one replica
        # close to the plain average: what compression dropped is in the residual
        res = out[rank][1].compression.feedback.residual["parameter delta"]
        flat_got = torch.cat([g.reshape(-1) for g in got])
        flat_want = torch.cat([w.reshape(-1) for w in want])
        tol = 1e-2 if compress == "fp16" else 3.0  # top-k / int8 drop real mass
        assert (flat_got - flat_want).abs().max() <= tol
        assert torch.isfinite(res).all()
    # moved from the start by about the mean delta, not N times it
    moved = torch.cat([(g - s).reshape(-1) for g, s in zip(out[0][0][0], start)])
    mean_delta = torch.cat([(w - s).reshape(-1) for w, s in zip(want, start)])
    assert moved.norm() <= 1.2 * mean_delta.norm()


def test_a_non_finite_delta_is_skipped_and_the_rank_rejoins() -> None:
    start, out = _rounds(RunConfig(compress="int8"), 2, poison=(1, 1))
    assert out[1][1].compression.screened.skipped == 1
    assert out[0][1].compression.screened.skipped == 0
    for rank in range(WORLD):
        for round_weights in out[rank][0]:
            assert all(torch.isfinite(w).all() for w in round_weights)
    # round 1: only rank 0's delta counted (rank 1 sent zeros), halved by the group of 2
    d0 = torch.cat([(w - s).reshape(-1) for w, s in zip(_weights(0, 1), start)])
    got = torch.cat([(w - s).reshape(-1) for w, s in zip(out[1][0][0], start)])
    assert torch.allclose(got, d0 / 2, atol=d0.abs().max() / 127)
