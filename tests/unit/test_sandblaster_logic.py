"""Sandblaster's pure pieces without processes: the two-loop recursion on a Gram matrix
equals the one on vectors (torch.optim.LBFGS's), shards split the vectors without changing
a scalar, and the portion scheduler's balancing / backup / re-issue rules."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hst

from phalanx.comm.wire import Header, Kind
from phalanx.ps.portions import PortionScheduler
from phalanx.ps.sandblaster_shard import Op, SandblasterShard
from phalanx.ps.vector_lbfgs import GradientDots, GramLBFGS


def two_loop(g, s_hist, y_hist, h_diag):
    """torch.optim.LBFGS's two-loop recursion on whole vectors (the reference)."""
    q = -g.clone()
    al = [0.0] * len(s_hist)
    ro = [1.0 / float(y @ s) for s, y in zip(s_hist, y_hist)]
    for i in range(len(s_hist) - 1, -1, -1):
        al[i] = float(s_hist[i] @ q) * ro[i]
        q -= al[i] * y_hist[i]
    r = q * h_diag
    for i in range(len(s_hist)):
        be = float(y_hist[i] @ r) * ro[i]
        r += (al[i] - be) * s_hist[i]
    return r


def quadratic(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=g, dtype=torch.float64)
    return a @ a.T / n + torch.eye(n, dtype=torch.float64), torch.randn(n, generator=g,
                                                                         dtype=torch.float64)


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("history", [1, 3])
def test_sharded_scalars_give_torch_s_directions(shards, history):
    """L-BFGS with a fixed step on a quadratic: shards (state machines, no transport) +
    GramLBFGS against torch's two-loop on whole vectors, iterate by iterate."""
    n = 23
    a, b = quadratic(n, 0)
    x0 = torch.zeros(n, dtype=torch.float64)
    cuts = [n * k // shards for k in range(shards + 1)]
    states = [SandblasterShard(k, x0[cuts[k] : cuts[k + 1]], history) for k in range(shards)]
    lb = GramLBFGS(history)
    # the reference
    x, s_hist, y_hist, h_diag, g_prev, d_prev, t = x0.clone(), [], [], 1.0, None, None, 0.5
    keep = False
    for it in range(8):
        g_ref = a @ x - b
        if g_prev is not None:
            s, y = t * d_prev, g_ref - g_prev
            if float(y @ s) > 1e-10:
                if len(s_hist) == history:
                    s_hist.pop(0), y_hist.pop(0)
                s_hist.append(s), y_hist.append(y)
                h_diag = float(y @ s) / float(y @ y)
        d_ref = two_loop(g_ref, s_hist, y_hist, h_diag)
        # the shards: push the gradient of the served point as one portion, ACCEPT, DIRECTION
        point = torch.cat([st.point for st in states])
        assert torch.allclose(point, x, atol=1e-12)
        grad = a @ point - b
        parts = []
        for k, st in enumerate(states):
            st.push(st.serving, 0, grad[cuts[k] : cuts[k + 1]].float().double())
            st.acc = grad[cuts[k] : cuts[k + 1]].clone()  # exact: no float32 rounding here
            parts.append(st.accept(st.serving, [1, 1.0]))
        keep = lb.observe(GradientDots.combine(parts, lb.pairs))
        coeffs, gtd = lb.direction()
        d_parts = [st.direction(it + 1, [float(keep), t, *coeffs.tolist()]) for st in states]
        d = torch.cat([st.d for st in states])
        assert torch.allclose(d, d_ref, rtol=1e-9, atol=1e-12), it
        assert gtd == pytest.approx(float(g_ref @ d_ref), rel=1e-9)
        assert max(float(p[0]) for p in d_parts) == pytest.approx(float(d_ref.abs().max()))
        g_prev, d_prev = g_ref, d_ref
        x = x + t * d_ref
    assert lb.pairs == min(history, 7)


def test_gradient_dots_length_grows_with_history_not_parameters():
    small = SandblasterShard(0, torch.zeros(10), 4)
    big = SandblasterShard(0, torch.zeros(10_000), 4)
    for st in (small, big):
        st.push(0, 0, torch.ones(st.x.numel()))
        assert st.accept(0, [1, 1.0]).numel() == GradientDots.length(0)


def test_shard_counts_duplicate_and_late_pushes_as_wasted():
    st = SandblasterShard(0, torch.zeros(4), 2)
    st.push(0, 0, torch.ones(4))
    st.push(0, 0, torch.ones(4))  # a backup's answer: same portion
    assert st.handle_command(Header(Kind.VECTOR, clock=0, flags=Op.ACCEPT),
                             torch.tensor([2.0, 2.0])) is None  # portion 1 missing: waits
    st.push(0, 1, 3 * torch.ones(4))
    out = st.release()
    assert out is not None and torch.allclose(st.g, 2 * torch.ones(4, dtype=torch.float64))
    st.direction(1, [0.0, 0.1, -1.0])  # d = -g
    st.push(0, 2, torch.ones(4))  # evaluation 0 is over
    assert (st.counters.pushes_applied, st.counters.pushes_wasted) == (2, 2)
    version, point = st.pull(0)
    assert version == 1 and point.numel() == 0  # an outdated portion is skipped
    assert torch.allclose(st.pull(1)[1], torch.full((4,), -0.2))


# ---- the scheduler -------------------------------------------------------------------


def drive(sched: PortionScheduler, speeds: list[float], seed: int = 0,
          die: dict[int, int] | None = None) -> float:
    """Simulate one evaluation: worker w takes speeds[w] per portion. Returns the time.
    Portions still running at the end (losing backups) carry over to the next call, as in
    the real run: their late answers are wasted."""
    rng = random.Random(seed)
    die = dict(die or {})
    # worker -> (finish time, evaluation, portion); times restart at 0 per evaluation
    running = {w: (0.0, e, p) for w, (_, e, p) in getattr(sched, "_running", {}).items()}
    now = 0.0
    done_by = {w: 0 for w in range(sched.workers)}
    while not sched.complete:
        for w, p in sched.assign():
            running[w] = (now + speeds[w] * (1 + 0.01 * rng.random()), sched.evaluation, p)
        assert running, "no worker is computing and the evaluation is not complete"
        w = min(running, key=lambda k: running[k][0])
        now, e, p = running.pop(w)
        if die.get(w) == done_by[w]:
            sched.lose(w)
            continue
        done_by[w] += 1
        sched.finish(w, e, p)
    sched._running = running
    return now


def test_faster_workers_do_more_and_backups_cut_the_tail():
    dynamic = PortionScheduler(4, 32)
    dynamic.begin(0)
    t_dyn = drive(dynamic, [4.0, 1.0, 1.0, 1.0])
    done = dynamic.counts.portions_done
    assert done[0] < min(done[1:]) and sum(done) == 32
    static = PortionScheduler(4, 4, static=True)
    static.begin(0)
    t_static = drive(static, [4 * 8.0, 8.0, 8.0, 8.0])  # one portion = 8 small ones
    assert t_static == pytest.approx(32.0, rel=0.02) and t_dyn < 0.45 * t_static
    assert static.counts.backups_issued == 0


def test_a_dead_worker_s_portion_is_reissued():
    sched = PortionScheduler(3, 6)
    sched.begin(0)
    drive(sched, [1.0, 1.0, 1.0], die={1: 0})
    assert sched.complete and 1 in sched.dead and sched.counts.portions_done[1] == 0


def test_static_portions_reissue_a_dead_worker_s_own_portion():
    sched = PortionScheduler(3, 3, static=True)
    sched.begin(0)
    drive(sched, [1.0, 1.0, 1.0], die={2: 0})
    assert sched.complete and sched.counts.reissued == 1
    sched.begin(1)  # next evaluation: the dead worker's portion goes to a live one at once
    drive(sched, [1.0, 1.0, 5.0])
    assert sched.counts.portions_done[2] == 0 and sched.complete


@settings(max_examples=60, deadline=None)
@given(hst.integers(1, 5), hst.integers(0, 20), hst.lists(hst.floats(0.5, 8.0), min_size=5,
                                                       max_size=5), hst.integers(0, 10**6))
def test_every_evaluation_completes_with_each_portion_counted_once(workers, extra, speeds,
                                                                   seed):
    sched = PortionScheduler(workers, workers + extra)
    for e in range(3):
        sched.begin(e)
        drive(sched, speeds[:workers], seed + e)
        assert sum(sched.counts.portions_done) == workers + extra
        # wasted: this evaluation's losing backups + late answers of the previous one
        assert sched.counts.backups_wasted <= sched.counts.backups_issued + workers
