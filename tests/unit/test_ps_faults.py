"""Faults in one process: dead workers dropped under every consistency model, lost and
repeated pushes (sequence numbers), the server loop with heartbeats on the in-process
transport, and a fuzz test of the decoder + shard (random and truncated messages)."""

import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.comm.transport import InProcNetwork, TransportTimeout
from phalanx.comm.wire import HEADER_LEN, MAGIC, Header, Kind, WireError
from phalanx.errors import PhalanxError
from phalanx.ps.client import Heartbeat, PSClient
from phalanx.ps.consistency import (
    Asynchronous,
    BulkSynchronous,
    SoftSynchronous,
    StaleSynchronous,
)
from phalanx.ps.partition import Partition
from phalanx.ps.server import Layout, serve
from phalanx.ps.shard import RESUME, WANT_DENSE, ShardState
from phalanx.rules import sgd

LR = 0.1


def make(consistency, workers=3, n=4):
    part = Partition(1, (0,), ((n,),), (0, n))
    return ShardState(0, part, torch.arange(float(n)), None, sgd(LR), consistency, workers)


def pull(s, w, clock=None, flags=WANT_DENSE):
    clock = s.clocks[w] if clock is None else clock
    return s.handle(w, Header(Kind.PULL, worker=w, clock=clock, flags=flags), [])


def push(s, w, value=1.0, seq=None, version=None):
    seq = s.clocks[w] if seq is None else seq
    version = s.version if version is None else version
    g = torch.full((s.dense.numel(),), value)
    return s.handle(w, Header(Kind.PUSH, worker=w, clock=seq, seq=seq, version=version), [g])


# ---- dead workers ----------------------------------------------------------------------


def test_bsp_barrier_releases_when_the_missing_worker_is_dropped():
    s = make(BulkSynchronous())
    for w in range(3):
        pull(s, w)
    push(s, 0, 1.0)
    push(s, 1, 3.0)
    assert s.version == 0 and pull(s, 0) == []  # held: worker 2 has not pushed
    released = s.drop_worker(2)
    assert s.version == 1 and [r.worker for r in released] == [0]
    assert torch.allclose(s.dense, torch.arange(4.0) - LR * 2.0)  # mean of the 2 live
    assert s.lost_workers == {2: 0} and s.stats.workers_lost == 1
    # the next rounds need only the survivors
    pull(s, 1)
    push(s, 0)
    push(s, 1)
    assert s.version == 2


def test_ssp_bound_counts_live_workers_only():
    s = make(StaleSynchronous(1))
    for _ in range(2):  # workers 0 and 1 run two clocks; worker 2 stays at 0
        for w in (0, 1):
            pull(s, w)
            push(s, w)
    assert pull(s, 0) == []  # clock 2 vs slowest 0: beyond the bound
    released = s.drop_worker(2)
    assert [r.worker for r in released] == [0]  # slowest live worker is now at 2


def test_softsync_n_is_capped_at_live_workers():
    s = make(SoftSynchronous(3))
    push(s, 0)
    push(s, 1)
    assert s.version == 0
    s.drop_worker(2)  # 2 live workers left: 2 buffered pushes are a batch now
    assert s.version == 1 and not s.buffer
    push(s, 0)
    push(s, 1)
    assert s.version == 2


def test_dropping_the_last_worker_flushes_and_ends():
    s = make(SoftSynchronous(3))
    push(s, 0)
    for w in range(3):
        s.drop_worker(w)
    assert not s.active and s.version == 1 and s.stats.pushes_applied == 1


# ---- sequence numbers: lost and repeated pushes ------------------------------------------


def test_lost_push_is_counted_and_does_not_block_the_barrier():
    s = make(BulkSynchronous(), workers=2)
    pull(s, 0)
    pull(s, 1)
    push(s, 0)  # worker 1's push of clock 0 is lost on the way
    (reply,) = pull(s, 1, clock=1) or [None]  # worker 1 moves on: clock 1 reveals the gap
    assert s.stats.pushes_lost == 1 and s.version == 1 and s.clocks[1] == 1
    assert reply is None or reply.worker == 1
    assert torch.allclose(s.dense, torch.arange(4.0) - LR)  # only worker 0's gradient


def test_gap_in_push_sequence_and_in_done_count_as_lost():
    s = make(Asynchronous(), workers=1)
    push(s, 0, seq=0)
    push(s, 0, seq=3)  # pushes 1 and 2 never arrived; 3 is applied
    assert s.stats.pushes_lost == 2 and s.stats.pushes_applied == 2 and s.clocks[0] == 4
    s.handle(0, Header(Kind.DONE, worker=0, clock=6), [])  # 4 and 5 lost too
    assert s.stats.pushes_lost == 4 and not s.active


def test_repeated_push_is_applied_once():
    s = make(Asynchronous(), workers=1)
    push(s, 0, seq=0)
    before = s.dense.clone()
    push(s, 0, seq=0)  # e.g. a restarted worker repeating a push the shard already had
    assert s.stats.duplicates == 1 and s.stats.pushes_applied == 1
    assert torch.equal(s.dense, before) and s.stats.pushes_rejected == 0


def test_resume_pull_tells_a_restarted_worker_its_clock():
    s = make(Asynchronous(), workers=2)
    for _ in range(3):
        push(s, 1)
    (reply,) = pull(s, 1, clock=0, flags=WANT_DENSE | RESUME)
    assert reply.header.clock == 3 and reply.header.version == 3
    assert s.stats.pushes_lost == 0


# ---- the server loop with heartbeats (in-process transport) ------------------------------


def run_workers(layout, net, part, steps, stop_after):
    """Workers as threads with heartbeats; worker w stops for good (no DONE, no more
    heartbeats: it "died") after ``stop_after[w]`` steps."""
    def worker(w):
        t = net.transport(layout.worker_rank(w))
        client = PSClient(t, part, layout, w, 20.0)
        beat = Heartbeat(t, layout, w, 0.05).start()
        flat = torch.zeros(part.dense_numel)
        try:
            for clock in range(steps):
                if clock == stop_after.get(w):
                    return
                client.pull(clock, flat)
                client.push(clock, torch.ones(part.dense_numel))
            beat.stop()
            client.done(steps, torch.zeros(5, dtype=torch.float64))
        finally:
            beat.stop()

    threads = [threading.Thread(target=worker, args=(w,), daemon=True)
               for w in range(layout.workers)]
    for t in threads:
        t.start()
    return threads


@pytest.mark.parametrize("consistency", [BulkSynchronous(), StaleSynchronous(1),
                                         SoftSynchronous(3), Asynchronous()], ids=repr)
def test_serve_drops_a_dead_worker_and_finishes(consistency):
    layout = Layout(1, 3)
    net = InProcNetwork(layout.world)
    s = make(consistency)
    threads = run_workers(layout, net, s.part, steps=20, stop_after={2: 5})
    serve(s, net.transport(0), layout, timeout_s=0.5, heartbeats=True,
          on_worker_loss="continue")
    for t in threads:
        t.join(10)
    assert s.lost_workers == {2: 5} and not s.active
    assert s.clocks[:2] == [20, 20]
    assert s.stats.pushes_applied == 2 * 20 + 5


def test_a_dropped_worker_s_sends_in_flight_are_forgotten():
    # a send still in flight to a dead worker could block the server when it waits on its
    # oldest sends (GlooTransport.send): the server tells its transport as it drops one
    layout = Layout(1, 3)
    net = InProcNetwork(layout.world)
    transport = net.transport(0)
    forgotten = []
    transport.forget = lambda lost: forgotten.append(set(lost))
    s = make(Asynchronous())
    threads = run_workers(layout, net, s.part, steps=10, stop_after={1: 2})
    serve(s, transport, layout, timeout_s=0.5, heartbeats=True, on_worker_loss="continue")
    for t in threads:
        t.join(10)
    assert s.lost_workers == {1: 2}
    assert forgotten == [{layout.worker_rank(1)}]


def test_serve_stops_with_an_error_naming_the_dead_worker():
    layout = Layout(1, 3)
    net = InProcNetwork(layout.world)
    s = make(BulkSynchronous())
    run_workers(layout, net, s.part, steps=20, stop_after={1: 3})
    with pytest.raises(PhalanxError, match=r"shard 0: worker\(s\) \[1\] silent for more"):
        serve(s, net.transport(0), layout, timeout_s=0.5, heartbeats=True,
              on_worker_loss="stop")


# ---- fuzz: random and truncated messages never crash the server nor move parameters ----

WORDS = st.integers(-(2**63), 2**63 - 1)


def _valid_words(kind):
    return Header(kind, worker=0, clock=0, seq=0, payload=((1, 4),)).encode().tolist()


@st.composite
def messages(draw):
    """A header (random, or a valid one with some words replaced, or cut short) and a
    payload (random dtype and length, possibly shorter than announced)."""
    how = draw(st.sampled_from(["random", "mutated", "truncated"]))
    if how == "random":
        words = draw(st.lists(WORDS, min_size=HEADER_LEN, max_size=HEADER_LEN))
    else:
        words = _valid_words(draw(st.sampled_from(list(Kind))))
        for i in draw(st.lists(st.integers(1, HEADER_LEN - 1), max_size=4)):
            words[i] = draw(st.one_of(WORDS, st.integers(-2, 8)))
        if how == "truncated":
            words = words[: draw(st.integers(0, HEADER_LEN - 1))]
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.int64]))
    size = draw(st.integers(0, 6))
    values = draw(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=size,
                           max_size=size))
    payload = [torch.tensor(values, dtype=torch.float64).to(dtype)]
    return torch.tensor(words, dtype=torch.int64), payload


@given(st.lists(messages(), min_size=1, max_size=8))
@settings(max_examples=150, deadline=None)
def test_fuzzed_messages_never_crash_and_never_change_parameters(batch):
    net = InProcNetwork(2)
    sender, receiver = net.transport(1), net.transport(0)
    s = make(BulkSynchronous(), workers=1)
    before = s.dense.clone()
    for wire, payload in batch:
        sender.send_raw(0, wire, payload)
        try:
            msg = receiver.recv(timeout_s=1)
        except WireError:
            continue
        except TransportTimeout:  # pragma: no cover - a message was just queued
            raise
        assert msg.header.kind in set(Kind)
        s.handle(0, msg.header, msg.tensors)  # must not raise, whatever it says
    # a push is only ever applied if it was well-formed: the payloads here are 0..6 values
    # of which only exactly-4 finite float32 ones fit the shard; those are counted
    if s.stats.pushes_applied == 0:
        assert torch.equal(s.dense, before)
    assert torch.isfinite(s.dense).all()


def test_truncated_header_and_short_payload_are_wire_errors():
    net = InProcNetwork(2)
    words = torch.tensor(_valid_words(Kind.PUSH), dtype=torch.int64)
    net.transport(1).send_raw(0, words[:7], [torch.ones(4)])
    with pytest.raises(WireError, match="header"):
        net.transport(0).recv()
    net.transport(1).send_raw(0, words, [torch.ones(3)])  # announced 4 values
    with pytest.raises(WireError, match="payload"):
        net.transport(0).recv()
    bad = words.clone()
    bad[0] = MAGIC ^ 1
    net.transport(1).send_raw(0, bad, [torch.ones(4)])
    with pytest.raises(WireError, match="magic"):
        net.transport(0).recv()
