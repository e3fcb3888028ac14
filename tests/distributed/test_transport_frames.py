"""GlooTransport's frames over real processes: a message goes as one frame (header and
payload in one gloo message, into a receive posted before it was sent) when it fits the
capacity both ends keep for the pair, else as a header and then its payload; both ends grow
the capacity alike, on every receive path (a receiver thread, a receive from one peer, from
several at once, the control channel). A receive buffer smaller than what arrives aborts
the process in gloo, so a disagreement here would kill the receiver, not just fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from phalanx.comm.transport import (
    CONTROL_TAG,
    FRAME_MAX,
    FRAME_START,
    HEADER_TAG,
    GlooTransport,
    frame_bytes,
    pack_frame,
    unpack_frame,
)
from phalanx.comm.wire import Header, Kind, WireError
from phalanx.runtime.launch import spawn

# float32 lengths, one message each: 1.6 MB is over FRAME_START (its payload follows),
# then fits; 4 MB again over, then fits; a small one between is whole
SIZES = [10, 400_000, 400_000, 1_000_000, 5, 1_000_000]
WHOLE = [True, False, True, False, True, True]


def _message(sender: int, i: int) -> list[torch.Tensor]:
    n = SIZES[i]
    return [torch.arange(n, dtype=torch.float32) + 1000 * sender + i,
            torch.arange(7, dtype=torch.bfloat16) + i,  # 14 bytes: padded on the wire
            torch.full((3,), sender + i, dtype=torch.int8)]


def _same(got: list[torch.Tensor], sender: int, i: int) -> bool:
    want = _message(sender, i)
    return len(got) == 3 and all(g.dtype == w.dtype and torch.equal(g, w)
                                 for g, w in zip(got, want))


def _frames(rank: int, world: int, out: str) -> None:
    import torch.distributed as dist

    if rank == 0:
        t = GlooTransport(0, world, concurrent=[1])
        ok = []
        for i in range(len(SIZES)):
            ok.append(_same(t.recv(timeout_s=30).tensors, 1, i))  # rank 1's receive thread
            # ranks 2 and 3: both at once, or each alone, in turn (the capacity carries over)
            got = t.recv_from([2, 3], timeout_s=30) if i % 2 == 0 else \
                [t.recv(2, timeout_s=30), t.recv(3, timeout_s=30)]
            ok += [m.src == src and _same(m.tensors, src, i) for m, src in zip(got, (2, 3))]
            final = t.recv(timeout_s=30, control=True)  # from any source, control channel
            ok.append(final.src == 3 and _same(final.tensors, 3, i))
        try:
            t.recv(3, timeout_s=30)
            bad = "accepted"
        except WireError as e:
            bad = str(e)
        after = t.recv(3, timeout_s=30)  # the pair goes on, posted with FRAME_MAX
        caps = {f"{tag} {peer}": c for (tag, peer), c in t._recv_cap.items()}
        t.recv(timeout_s=30)  # rank 1's DONE: its thread ends
        Path(out, "0.json").write_text(json.dumps({
            "ok": ok, "bad": bad,
            "after": bool(torch.equal(after.tensors[0], torch.ones(1_200_000))),
            "caps": caps}))
        return
    t = GlooTransport(rank, world)
    whole = []
    for i in range(len(SIZES)):
        t.send(0, Header(Kind.PUSH, worker=rank, clock=i), _message(rank, i))
        whole.append(len(t._inflight[-1][1]) == 1)  # one gloo send: the frame
        if rank == 3:
            t.send(0, Header(Kind.FINAL, worker=rank, clock=i), _message(rank, i))
    if rank == 3:  # a frame whose length is not its header's, then a message that follows
        wire = Header(Kind.PUSH, worker=3).encode()
        dist.isend(torch.cat([torch.tensor([999]), wire]), 0, tag=HEADER_TAG).wait()
        t.send(0, Header(Kind.PUSH, worker=3), [torch.ones(1_200_000)])
        whole.append(len(t._inflight[-1][1]) == 1)
    if rank == 1:
        t.send(0, Header(Kind.DONE, worker=1))
    t.flush()
    caps = {f"{tag} {peer}": c for (tag, peer), c in t._send_cap.items()}
    Path(out, f"{rank}.json").write_text(json.dumps({"whole": whole, "caps": caps}))


def _grown(sizes: list[int]) -> int:
    cap = FRAME_START
    for n in sizes:
        cap = max(cap, frame_bytes(Header(Kind.PUSH, payload=((1, n), (4, 7), (7, 3)))))
    return cap


def test_frames_whole_where_they_fit_and_both_ends_grow_alike(tmp_path):
    spawn(_frames, 4, (str(tmp_path),))
    r = {k: json.loads((tmp_path / f"{k}.json").read_text()) for k in range(4)}
    assert r[0]["ok"] == [True] * (4 * len(SIZES)), r[0]["ok"]
    for k in (1, 2):
        assert r[k]["whole"] == WHOLE
        assert r[k]["caps"] == {f"{HEADER_TAG} 0": _grown(SIZES)}
    # rank 3: the same, and its last message (4.8 MB, over its 4 MB capacity) after its header
    assert r[3]["whole"] == WHOLE + [False]
    last = frame_bytes(Header(Kind.PUSH, payload=((1, 1_200_000),)))
    assert r[3]["caps"] == {f"{HEADER_TAG} 0": last, f"{CONTROL_TAG} 0": _grown(SIZES)}
    assert "frame length 999 does not match" in r[0]["bad"]
    assert r[0]["after"]
    # the receiver posts what each sender sends with; after the bad frame, FRAME_MAX
    assert r[0]["caps"] == {f"{HEADER_TAG} 1": _grown(SIZES), f"{HEADER_TAG} 2": _grown(SIZES),
                            f"{HEADER_TAG} 3": FRAME_MAX, f"{CONTROL_TAG} 3": _grown(SIZES)}


@pytest.mark.parametrize("dtypes", [(torch.float32,), (torch.bfloat16, torch.int8, torch.int64),
                                    (torch.float16, torch.float64, torch.int32)])
def test_a_frame_packs_and_unpacks_every_dtype_padded_to_8_bytes(dtypes):
    from phalanx.comm.transport import _with_payload

    ts = [(torch.arange(2 * i + 3) * 3 - 4).to(d) for i, d in enumerate(dtypes)]
    header, flat = _with_payload(Header(Kind.PUSH, worker=1, clock=4), ts)
    frame = pack_frame(header.encode(), flat)
    assert int(frame[0]) == frame.numel() * 8 == frame_bytes(header)
    assert frame_bytes(header) == 8 * 13 + sum((t.numel() * t.element_size() + 7) // 8 * 8
                                               for t in ts)
    posted = torch.full((frame.numel() + 50,), -7, dtype=torch.int64)  # a larger buffer
    posted[:frame.numel()] = frame
    assert Header.decode(posted[1:13]) == header
    for copy in (False, True):
        got = unpack_frame(header, posted, copy=copy)
        assert [g.dtype for g in got] == list(dtypes)
        assert all(torch.equal(g, t) for g, t in zip(got, ts))
        assert all((g.untyped_storage().data_ptr() == posted.untyped_storage().data_ptr())
                   != copy for g in got)
    split = pack_frame(header.encode(), None)  # the payload follows: [0][header]
    assert split.tolist() == [0] + header.encode().tolist()
