"""The shard state machine, driven message by message (deterministic, no threads)."""

import contextlib
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.comm.wire import Header, Kind
from phalanx.ps.consistency import (
    Asynchronous,
    BulkSynchronous,
    SoftSynchronous,
    StaleSynchronous,
)
from phalanx.ps.partition import Partition, SparseTable
from phalanx.ps.shard import HAS_ROWS, WANT_DENSE, ShardState
from phalanx.rules import chain, dc_asgd, sgd, staleness_scaled

LR = 0.1


def make(consistency, workers=2, values=(1.0, 2.0, 3.0, 4.0), rule=None, keep_backups=False,
         log=None):
    part = Partition(1, (0,), ((len(values),),), (0, len(values)))
    return ShardState(0, part, torch.tensor(values), None, rule or sgd(LR), consistency,
                      workers, keep_backups=keep_backups, log=log)


def pull(s, w, clock=None):
    clock = s.clocks[w] if clock is None else clock
    return s.handle(w, Header(Kind.PULL, worker=w, clock=clock, flags=WANT_DENSE), [])


def push(s, w, grad, version, clock=None):
    clock = s.clocks[w] if clock is None else clock
    g = torch.as_tensor(grad, dtype=torch.float32)
    return s.handle(w, Header(Kind.PUSH, worker=w, clock=clock, seq=clock, version=version),
                    [g])


def test_scripted_interleaving_records_staleness():
    events = []
    s = make(Asynchronous(), workers=3, log=lambda kind, **f: events.append((kind, f)))
    for w in range(3):
        (reply,) = pull(s, w)
        assert reply.header.version == 0
    push(s, 0, [1, 1, 1, 1], version=0)  # applied at version 0: staleness 0
    push(s, 1, [1, 1, 1, 1], version=0)  # one update since worker 1 pulled
    (reply,) = pull(s, 0)
    assert reply.header.version == 2
    push(s, 2, [1, 1, 1, 1], version=0)  # two updates since worker 2 pulled
    push(s, 0, [1, 1, 1, 1], version=2)
    applies = [f for kind, f in events if kind == "apply"]
    assert [(a["worker"], a["staleness"]) for a in applies] == [(0, 0), (1, 1), (2, 2), (0, 1)]
    assert [a["version"] for a in applies] == [0, 1, 2, 3]
    assert s.stats.histogram() == [1, 2, 1] and s.version == 4
    assert torch.allclose(s.dense, torch.tensor([1.0, 2, 3, 4]) - 4 * LR)


def test_bsp_averages_one_round_and_holds_fast_workers():
    s = make(BulkSynchronous(), workers=2)
    assert len(pull(s, 0)) == 1 and len(pull(s, 1)) == 1
    push(s, 0, [1, 1, 1, 1], 0)
    assert s.version == 0  # waiting for worker 1
    assert pull(s, 0) == []  # worker 0 at clock 1 waits at the barrier
    released = push(s, 1, [3, 3, 3, 3], 0)
    assert [r.worker for r in released] == [0] and released[0].header.version == 1
    assert torch.allclose(s.dense, torch.tensor([1.0, 2, 3, 4]) - LR * 2)
    assert s.stats.histogram() == [2]


def test_softsync_applies_average_of_n_and_flushes_at_end():
    s = make(SoftSynchronous(2), workers=3)
    push(s, 0, [1, 1, 1, 1], 0)
    assert s.version == 0
    push(s, 1, [3, 3, 3, 3], 0)
    assert s.version == 1 and torch.allclose(s.dense, torch.tensor([1.0, 2, 3, 4]) - 2 * LR)
    push(s, 2, [2, 2, 2, 2], 0)
    assert s.version == 1
    for w in range(3):
        s.handle(w, Header(Kind.DONE, worker=w, clock=s.clocks[w]), [])
    assert s.version == 2 and not s.buffer  # the leftover push is applied at the end


@pytest.mark.parametrize("grad, reason", [
    ([1.0, 1.0, 1.0], "does not match"),
    (torch.ones(4, dtype=torch.float64), "does not match"),
    ([1.0, math.nan, 1.0, 1.0], "NaN or Inf"),
    ([1.0, math.inf, 1.0, 1.0], "NaN or Inf"),
])
def test_bad_push_is_rejected_counted_and_harmless(grad, reason):
    s = make(Asynchronous())
    before = s.dense.clone()
    g = grad if isinstance(grad, torch.Tensor) else torch.tensor(grad)
    s.handle(0, Header(Kind.PUSH, worker=0, clock=0, seq=0, version=0), [g])
    assert s.stats.pushes_rejected == 1 and s.stats.pushes_applied == 0
    assert any(reason in r for r in s.stats.reasons)
    assert torch.equal(s.dense, before)
    assert s.clocks[0] == 1  # the iteration still ends, so no barrier can hang on it
    push(s, 0, [1, 1, 1, 1], 0)  # and the next good push is applied
    assert s.stats.pushes_applied == 1


def test_future_bogus_and_foreign_messages_are_rejected():
    s = make(Asynchronous())
    before = s.dense.clone()
    push(s, 0, [1, 1, 1, 1], 0, clock=5000)  # a sequence gap no lossy link explains
    push(s, 0, [1, 1, 1, 1], version=7)  # a version the shard never had
    s.handle(9, Header(Kind.PUSH, worker=9), [torch.ones(4)])  # no such worker
    s.handle(0, Header(Kind.FINAL, worker=0), [])  # not a worker's message kind
    s.handle(0, Header(Kind.PUSH, worker=0, shard=3), [torch.ones(4)])  # other shard
    assert s.stats.pushes_rejected == 1 and s.stats.messages_rejected == 4
    assert torch.equal(s.dense, before) and s.stats.pushes_lost == 0


def test_dc_asgd_compensates_with_the_pushing_workers_backup():
    lam = 0.5
    rule = chain(dc_asgd(lam), sgd(LR))
    s = make(Asynchronous(), rule=rule, keep_backups=True)
    pull(s, 0)
    pull(s, 1)
    w0 = s.dense.clone()
    g0, g1 = torch.tensor([1.0, -2, 0.5, 3]), torch.tensor([2.0, 1, -1, 0.5])
    push(s, 0, g0, 0)  # w_now == backup: no compensation
    w1 = w0 - LR * g0
    assert torch.allclose(s.dense, w1)
    push(s, 1, g1, 0)  # worker 1's backup is w0, the weights are now w1
    expected = w1 - LR * (g1 + lam * g1 * g1 * (w1 - w0))
    assert torch.allclose(s.dense, expected, atol=1e-7)


def test_dc_asgd_gives_sparse_rows_no_compensation():
    """As docs/parameter-server.md states: a table row's backup is the row as it is when
    the push is applied, so w_now - w_backup = 0 and the row takes the plain rule step,
    while the same push's dense slice is compensated against the worker's pulled copy."""
    lam = 0.5
    part = Partition(1, (0,), ((2,),), (0, 2), SparseTable(1, 4, 3))
    table = torch.arange(12, dtype=torch.float32).view(4, 3)
    s = ShardState(0, part, torch.tensor([1.0, 2.0]), table, chain(dc_asgd(lam), sgd(LR)),
                   Asynchronous(), 2, keep_backups=True)
    ids = torch.tensor([1])
    for w in range(2):
        s.handle(w, Header(Kind.PULL, worker=w, flags=WANT_DENSE | HAS_ROWS), [ids])
    w0, r0 = s.dense.clone(), s.rows[1].clone()
    g0, g1 = torch.tensor([1.0, -2.0]), torch.tensor([2.0, 1.0])
    h0, h1 = torch.tensor([1.0, 2.0, -1.0]), torch.tensor([3.0, -1.0, 2.0])
    for w, g, h in ((0, g0, h0), (1, g1, h1)):  # both computed at version 0
        s.handle(w, Header(Kind.PUSH, worker=w, version=0, flags=HAS_ROWS), [g, ids, h])
    w1, r1 = w0 - LR * g0, r0 - LR * h0
    assert torch.allclose(s.dense, w1 - LR * (g1 + lam * g1 * g1 * (w1 - w0)), atol=1e-7)
    assert torch.equal(s.rows[1], r1 - LR * h1)  # no compensation for the row
    assert (lam * h1 * h1 * (r1 - r0)).abs().min() > 0.01  # though it would have had one


def test_staleness_scaled_lr_divides_by_staleness():
    s = make(Asynchronous(), workers=3, rule=chain(staleness_scaled(), sgd(LR)))
    for w in range(3):
        pull(s, w)
    push(s, 0, [1, 1, 1, 1], 0)
    push(s, 1, [1, 1, 1, 1], 0)
    push(s, 2, [1, 1, 1, 1], 0)  # staleness 0, 1, 2 -> steps lr, lr, lr/2
    assert torch.allclose(s.dense, torch.tensor([1.0, 2, 3, 4]) - LR * 2.5)


def test_sparse_rows_are_pulled_and_pushed_by_id():
    part = Partition(2, (0,), ((2,),), (0, 1, 2), SparseTable(1, 7, 3))
    table = torch.arange(21, dtype=torch.float32).view(7, 3)
    s = ShardState(1, part, torch.zeros(1), table[1::2], sgd(1.0), Asynchronous(), 1)
    ids = torch.tensor([5, 1])
    (reply,) = s.handle(0, Header(Kind.PULL, worker=0, shard=1, flags=HAS_ROWS), [ids])
    assert reply.tensors[0].numel() == 0  # no dense part was asked for
    assert torch.equal(reply.tensors[1], table[[5, 1]])
    grads = torch.ones(2, 3)
    s.handle(0, Header(Kind.PUSH, worker=0, shard=1, flags=HAS_ROWS),
             [torch.zeros(1), ids, grads.view(-1)])
    expect = table[1::2].clone()
    expect[[2, 0]] -= 1.0  # rows 5 and 1 are local rows 2 and 0; rows 3 untouched
    assert torch.equal(s.rows, expect) and s.stats.pushes_applied == 1
    # a row another shard owns, or out of range, is rejected
    s.handle(0, Header(Kind.PUSH, worker=0, shard=1, clock=1, seq=1, flags=HAS_ROWS),
             [torch.zeros(1), torch.tensor([2]), torch.ones(3)])
    s.handle(0, Header(Kind.PULL, worker=0, shard=1, clock=2, flags=HAS_ROWS),
             [torch.tensor([99])])
    assert s.stats.pushes_rejected == 1 and s.stats.messages_rejected == 1


# ---- every consistency model through the same checks -------------------------------------

MODELS = [BulkSynchronous(), Asynchronous(), StaleSynchronous(0), StaleSynchronous(2),
          SoftSynchronous(1), SoftSynchronous(3)]


@pytest.mark.parametrize("model", MODELS, ids=repr)
def test_conformance_admits_is_monotone(model):
    for slowest in range(5):
        admitted = [model.admits(c, slowest) for c in range(slowest, slowest + 6)]
        # a worker level with the slowest may always go; admission only ever closes
        assert admitted[0]
        assert admitted == sorted(admitted, reverse=True)


@pytest.mark.parametrize("model", MODELS, ids=repr)
def test_conformance_never_ready_on_empty_and_always_when_all_pushed(model):
    assert not model.ready([], {0, 1, 2})
    # one push from every active worker is always enough (SoftSync(n) with n <= N)
    assert model.ready([0, 1, 2], {0, 1, 2})


@pytest.mark.parametrize("model", MODELS, ids=repr)
@given(order=st.lists(st.integers(0, 2), min_size=0, max_size=60))
@settings(max_examples=40, deadline=None)
def test_conformance_random_schedule_finishes_and_keeps_its_bound(model, order):
    """Workers run at random speeds (``order`` says who tries to move next). Each worker
    does ROUNDS iterations of pull -> push. Every run must finish, every push must be
    applied exactly once, and the clock gap at every admitted pull must respect the
    model's bound (SSP: s, BSP: 0)."""
    rounds, workers = 4, 3
    bound = {"bsp": 0}.get(model.name, getattr(model, "bound", None))
    s = make(model, workers=workers)
    waiting = set()  # workers whose pull is parked
    pulled = [False] * workers  # has the current iteration's pull been answered

    def answered(replies):
        for r in replies:
            w = r.worker
            waiting.discard(w)
            pulled[w] = True
            if bound is not None:
                slowest = min(s.clocks[a] for a in s.active)
                assert s.clocks[w] - slowest <= bound

    def move(w):
        if w not in s.active or w in waiting:
            return
        if s.clocks[w] == rounds:
            answered(s.handle(w, Header(Kind.DONE, worker=w, clock=rounds), []))
        elif not pulled[w]:
            replies = pull(s, w)
            waiting.add(w)
            answered(replies)
        else:
            pulled[w] = False
            answered(push(s, w, [1, 1, 1, 1], s.version))

    for w in order:
        move(w)
    for _ in range(workers * rounds * 3 + 3):  # then round-robin until everyone is done
        for w in range(workers):
            move(w)
    assert not s.active and not s.parked
    assert s.stats.pushes_applied == rounds * workers and not s.buffer


@pytest.mark.parametrize("keep_backups", [False, True])
def test_a_pull_answer_is_a_snapshot(keep_backups):
    """The transport reads a reply's payload after handle() returned (gloo's isend), while
    the next push changes the weights in place: the reply must not be the live tensor."""
    s = make(Asynchronous(), workers=2, keep_backups=keep_backups)
    (reply,) = pull(s, 0)
    sent = reply.tensors[0]
    assert reply.header.version == 0
    push(s, 1, [1.0, 1.0, 1.0, 1.0], 0)  # worker 1's push lands before the send finished
    assert s.version == 1 and not torch.equal(s.dense, sent)
    assert torch.equal(sent, torch.tensor([1.0, 2.0, 3.0, 4.0]))  # still version 0
    assert sent.data_ptr() != s.dense.data_ptr()


# ---- edges the mutation runs showed (make mutate) -------------------------------------------

def test_events_and_reasons_are_recorded_exactly():
    from phalanx.ps.shard import ShardStats

    events = []
    s = make(BulkSynchronous(), workers=2, log=lambda kind, **f: events.append((kind, f)))
    assert ShardStats().histogram() == []
    for _ in range(2):
        s.handle(5, Header(Kind.PULL, worker=5), [])
    assert s.stats.reasons == {"message from an unknown or finished worker": 2}
    assert events[0] == ("reject", {"shard": 0,
                                    "reason": "message from an unknown or finished worker"})
    s.log_worker_lost(1, "silent")
    assert events[-1] == ("worker_lost", {"shard": 0, "worker": 1, "clock": 0, "version": 0,
                                          "reason": "silent"})
    s.stats.staleness.update({0: 2, 2: 1})
    assert s.stats.histogram() == [2, 0, 1]


def test_done_releases_a_barrier_the_finished_worker_held():
    s = make(BulkSynchronous(), workers=2)
    pull(s, 0)
    pull(s, 1)
    push(s, 0, [1, 1, 1, 1], 0)  # BSP waits for worker 1 ...
    assert s.version == 0
    s.handle(1, Header(Kind.DONE, worker=1, clock=0), [torch.zeros(1)])
    assert s.version == 1  # ... which finished instead: the buffer is applied


@pytest.mark.parametrize("ids,reason", [
    (torch.tensor([1], dtype=torch.int32), "row ids are not int64"),
    (torch.tensor([7]), "row id out of range"),
    (torch.tensor([-1]), "row id out of range"),
    (torch.tensor([2]), "row id held by another shard"),
    (torch.tensor([1, 1]), "repeated row id"),
])
def test_bad_row_ids_name_the_reason(ids, reason):
    part = Partition(2, (0,), ((2,),), (0, 1, 2), SparseTable(1, 7, 3))
    s = ShardState(1, part, torch.zeros(1), torch.zeros(3, 3), sgd(1.0), Asynchronous(), 1)
    s.handle(0, Header(Kind.PULL, worker=0, shard=1, flags=HAS_ROWS), [ids])
    assert s.stats.reasons == {f"pull: {reason}": 1}


def test_sparse_rows_keep_their_own_optimizer_state():
    """AdaGrad on the table: each row's accumulator is gathered, updated and scattered
    back, so a row pushed twice takes the second step with its own history only."""
    from phalanx.rules import adagrad

    part = Partition(1, (0,), ((1,),), (0, 1), SparseTable(1, 4, 2))
    table = torch.zeros(4, 2)
    s = ShardState(0, part, torch.zeros(1), table, adagrad(1.0), Asynchronous(), 1)
    steps = [(torch.tensor([1, 3]), torch.tensor([[1.0, 2.0], [3.0, 4.0]])),
             (torch.tensor([3]), torch.tensor([[1.0, 1.0]]))]
    acc, want = torch.zeros(4, 2), torch.zeros(4, 2)
    for clock, (ids, g) in enumerate(steps):
        s.handle(0, Header(Kind.PULL, worker=0, clock=clock, flags=HAS_ROWS), [ids])
        s.handle(0, Header(Kind.PUSH, worker=0, clock=clock, seq=clock, flags=HAS_ROWS),
                 [torch.zeros(1), ids, g.reshape(-1)])
        acc[ids] += g * g
        want[ids] -= g / (acc[ids].sqrt() + 1e-10)
    assert torch.allclose(s.rows, want, atol=1e-6) and s.stats.pushes_applied == 2
    assert torch.equal(s.rows[[0, 2]], torch.zeros(2, 2))  # untouched rows never move


def test_a_failed_checksum_resyncs_in_full_and_says_so():
    from phalanx.comm.compress import CompressSpec, checksum, codec_flags, make_codec
    from phalanx.comm.ps_payload import PullDeltas
    from phalanx.ps.shard import CHECKED

    events = []
    part = Partition(1, (0,), ((4,),), (0, 4))
    s = ShardState(0, part, torch.tensor([1.0, 2.0, 3.0, 4.0]), None, sgd(LR), Asynchronous(),
                   1, log=lambda kind, **f: events.append((kind, f)),
                   pulls=PullDeltas(make_codec(CompressSpec("int8"))))
    flags = WANT_DENSE | codec_flags(CompressSpec("int8"))
    (first,) = s.handle(0, Header(Kind.PULL, worker=0, flags=flags), [])
    held = first.tensors[0].clone()
    good = torch.tensor([checksum(held)], dtype=torch.int64)
    (ok,) = s.handle(0, Header(Kind.PULL, worker=0, flags=flags | CHECKED), [good])
    assert ok.header.flags & CHECKED == 0 and s.stats.pull_resyncs == 0
    bad = torch.tensor([checksum(held) ^ 1], dtype=torch.int64)
    (full,) = s.handle(0, Header(Kind.PULL, worker=0, flags=flags | CHECKED), [bad])
    assert full.header.flags == WANT_DENSE and torch.equal(full.tensors[0], s.dense)
    assert s.stats.pull_resyncs == 1
    assert events == [("resync", {"shard": 0, "worker": 0, "version": 0})]


def test_dc_asgd_backup_is_the_decoded_copy_under_compressed_pulls():
    from phalanx.comm.compress import CompressSpec, codec_flags, make_codec
    from phalanx.comm.ps_payload import PullDeltas

    s = make(Asynchronous(), workers=1, values=(0.1, 0.2, 0.3, 0.37),
             rule=chain(dc_asgd(0.5), sgd(LR)), keep_backups=True)
    s.pulls = PullDeltas(make_codec(CompressSpec("int8")))
    flags = WANT_DENSE | codec_flags(CompressSpec("int8"))
    s.handle(0, Header(Kind.PULL, worker=0, flags=flags), [])
    push(s, 0, [1.0, -0.3, 0.77, 0.01], version=0)
    s.handle(0, Header(Kind.PULL, worker=0, clock=1, flags=flags), [])
    held = s.pulls.held(0)
    assert not torch.equal(held, s.dense)  # int8 left something out ...
    assert torch.equal(s.backups[0], held)  # ... and the backup is what the worker holds


def test_finished_workers_and_exact_reasons():
    s = make(Asynchronous(), workers=2)
    s.handle(1, Header(Kind.DONE, worker=1, clock=0), [torch.zeros(1)])
    pull(s, 1, clock=0)
    s.handle(0, Header(Kind.PULL, worker=0, shard=3), [])
    s.handle(0, Header(Kind.PUSH, worker=0, seq=5000), [torch.zeros(4)])
    assert s.stats.reasons == {"message from an unknown or finished worker": 1,
                               "message addressed to another shard": 1,
                               "sequence number 5000 too far ahead of 0": 1}
    from phalanx.ps.shard import SKIPPED

    s.handle(0, Header(Kind.PUSH, worker=0, seq=0, flags=SKIPPED), [])
    assert s.stats.reasons["push: the worker skipped a gradient holding NaN or inf"] == 1
    push(s, 0, [1, 1, 1, 1], version=0)
    assert (s.stats.updates, s.stats.pushes_applied, s.stats.pushes_rejected) == (1, 1, 1)


@pytest.mark.parametrize("model", [Asynchronous, BulkSynchronous])
def test_updates_overlapped_on_their_thread_equal_the_inline_ones_bit_for_bit(model):
    """serve() runs a large slice's update on a thread of its own while it receives the
    next message (ShardState.overlapped): every reply, the weights and the rule's state
    must be what the shard computes in line, and the update must really run there."""
    from phalanx.ps.updater import OVERLAP_MIN
    from phalanx.rules import momentum, state_tensors

    n = OVERLAP_MIN + 5
    g = torch.Generator().manual_seed(3)
    start = torch.randn(n, generator=g)
    grads = [torch.randn(n, generator=g) for _ in range(6)]

    def run(overlap: bool):
        s = make(model(), workers=2, values=start.tolist(), rule=momentum(0.05, 0.9))
        replies = []
        ctx = s.overlapped() if overlap else contextlib.nullcontext()
        with ctx:
            for i, grad in enumerate(grads):
                w = i % 2
                replies += pull(s, w)
                # the shard owns what it received: each push gets its own copy
                replies += push(s, w, grad.clone(), version=s.version)
                if overlap and model is Asynchronous:
                    assert s.updater.pending is not None  # the update is on its thread
        return s, [r.tensors[0] for r in replies]

    inline, inline_replies = run(False)
    overlapped, overlapped_replies = run(True)
    assert len(inline_replies) == len(overlapped_replies) > 0
    for a, b in zip(inline_replies, overlapped_replies):
        assert torch.equal(a, b)
    assert torch.equal(inline.dense, overlapped.dense)
    for a, b in zip(state_tensors(inline.dense_state), state_tensors(overlapped.dense_state)):
        assert torch.equal(a, b)
    assert not torch.equal(inline.dense, start)  # the pushes did move the weights


@pytest.mark.parametrize("model", [Asynchronous(), BulkSynchronous(), StaleSynchronous(1)])
def test_a_push_with_its_pull_is_a_push_then_a_pull(model):
    """PUSH_PULL (the pull sent with the push) releases the same replies and leaves the same
    state as the PUSH followed by the worker's next PULL, on a random schedule of 2 workers
    (a bad push, a NaN, held-back pulls included)."""
    gen = torch.Generator().manual_seed(0)
    apart, merged = (make(model, rule=dc_asgd(0.5), keep_backups=True) for _ in range(2))
    for s in (apart, merged):
        for w in (0, 1):
            pull(s, w)
    replies: dict[str, list] = {"apart": [], "merged": []}
    for step in range(40):
        w = int(torch.randint(2, (1,), generator=gen))
        g = torch.randn(4, generator=gen)
        if step == 7:
            g[1] = float("nan")
        if step == 11:
            g = torch.ones(3)
        c = apart.clocks[w]
        h = Header(Kind.PUSH, worker=w, clock=c, seq=c, version=apart.version)
        replies["apart"] += apart.handle(w, h, [g.clone()]) + pull(apart, w, c + 1)
        h = Header(Kind.PUSH_PULL, worker=w, clock=c, seq=c, version=merged.version)
        replies["merged"] += merged.handle(w, h, [g.clone()])
    assert torch.equal(apart.dense, merged.dense)
    assert apart.clocks == merged.clocks and apart.version == merged.version
    assert apart.stats == merged.stats
    assert len(replies["apart"]) == len(replies["merged"]) > 0
    for a, b in zip(replies["apart"], replies["merged"]):
        assert a.worker == b.worker and a.header == b.header
        assert all(torch.equal(x, y) for x, y in zip(a.tensors, b.tensors))
