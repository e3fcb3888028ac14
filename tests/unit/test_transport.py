"""Wire format and the in-process transport (gloo: tests/distributed/test_ps.py)."""

import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.comm.transport import GlooTransport, InProcNetwork, TransportTimeout
from phalanx.comm.wire import HEADER_BYTES, HEADER_LEN, MAGIC, Header, Kind, WireError


def test_header_round_trip():
    h = Header(Kind.PUSH, worker=3, clock=17, version=9, shard=1, seq=5, flags=2,
               payload=((1, 1000), (5, 7), (2, 0)))
    assert Header.decode(h.encode()) == h


@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=HEADER_LEN, max_size=HEADER_LEN))
@settings(max_examples=200, deadline=None)
def test_any_header_decodes_or_raises_wire_error(words):
    t = torch.tensor(words, dtype=torch.int64)
    try:
        h = Header.decode(t)
    except WireError:
        return
    assert h.kind in set(Kind)


@pytest.mark.parametrize("mutate, message", [
    (lambda w: w.__setitem__(0, 123), "magic"),
    (lambda w: w.__setitem__(1, 99), "kind"),
    (lambda w: w.__setitem__(7, 5 << 8), "payload count"),
    (lambda w: w.__setitem__(8, (10 << 4) | 15), "dtype"),
    (lambda w: w.__setitem__(8, (-4 << 4) | 1), "length"),
    (lambda w: w.__setitem__(11, 1), "unused"),
    (lambda w: w.__setitem__(3, -1), "negative"),
])
def test_bad_headers_are_named(mutate, message):
    words = Header(Kind.PUSH, payload=((1, 4),)).encode().tolist()
    mutate(words)
    with pytest.raises(WireError, match=message):
        Header.decode(torch.tensor(words, dtype=torch.int64))
    with pytest.raises(WireError):
        Header.decode(torch.zeros(HEADER_LEN, dtype=torch.float32))


def test_inproc_order_sources_and_bytes():
    net = InProcNetwork(3)
    a, b, c = (net.transport(r) for r in range(3))
    a.send(2, Header(Kind.PUSH, worker=0, clock=0), [torch.ones(4)])
    b.send(2, Header(Kind.PUSH, worker=1, clock=0), [torch.ones(2, 3)])
    a.send(2, Header(Kind.PUSH, worker=0, clock=1), [torch.arange(3, dtype=torch.int64)])
    first_b = c.recv(src=1)
    assert first_b.src == 1 and first_b.tensors[0].shape == (6,)  # flattened on the wire
    m1, m2 = c.recv(), c.recv()
    assert (m1.header.clock, m2.header.clock) == (0, 1)  # per-pair order kept
    assert m2.tensors[0].dtype == torch.int64
    assert a.counter.sent == 2 * HEADER_BYTES + 16 + 24 and a.counter.messages_sent == 2
    assert c.counter.received == a.counter.sent + b.counter.sent


def test_inproc_sender_changes_after_send_are_not_seen():
    net = InProcNetwork(2)
    t = torch.zeros(3)
    net.transport(0).send(1, Header(Kind.PARAMS), [t])
    t += 5
    assert net.transport(1).recv().tensors[0].tolist() == [0, 0, 0]


def test_inproc_timeout_and_wakeup():
    net = InProcNetwork(2)
    with pytest.raises(TransportTimeout):
        net.transport(1).recv(timeout_s=0.05)
    threading.Timer(0.05, lambda: net.transport(0).send(1, Header(Kind.DONE))).start()
    assert net.transport(1).recv(timeout_s=5).header.kind == Kind.DONE


def test_inproc_rejects_payload_that_contradicts_header():
    net = InProcNetwork(2)
    wire = Header(Kind.PUSH, payload=((1, 4),)).encode()
    net.transport(0).send_raw(1, wire, [torch.ones(5)])
    with pytest.raises(WireError, match="payload"):
        net.transport(1).recv()
    bad = wire.clone()
    bad[0] = MAGIC + 1
    net.transport(0).send_raw(1, bad, [torch.ones(4)])
    with pytest.raises(WireError, match="magic"):
        net.transport(1).recv()


def test_gloo_transport_forgets_the_sends_in_flight_to_dead_ranks():
    # bookkeeping only (no process group): the sends to rank 2 leave the in-flight list, so
    # neither send's trimming nor flush waits on them; rank 1's stay
    t = GlooTransport(0, 3)
    t._inflight = [(1, ["w1"], []), (2, ["w2"], []), (1, ["w3"], []), (2, ["w4"], [])]
    t.forget({2})
    assert t._inflight == [(1, ["w1"], []), (1, ["w3"], [])]
    assert t._dead == {2}
    t.forget({1})
    assert t._inflight == [] and t._dead == {1, 2}
