"""The shard's side of compressed pulls (:class:`PullDeltas`) alone: the first reply is the
full slice, later ones compressed deltas that move the copy by what the worker decodes, a
delta beyond the codec's range is clipped (the rest follows), a non-finite one is sent
whole, rand-k replies draw new indices each time, and :meth:`matches` is exact."""

from __future__ import annotations

import torch

from phalanx.comm.compress import (
    FP32_LIMIT,
    CompressSpec,
    checksum,
    codec_flags,
    decode_payload,
    make_codec,
)
from phalanx.comm.ps_payload import PullDeltas, decode_push


def _pulls(name: str, ratio: float = 1.0) -> PullDeltas:
    return PullDeltas(make_codec(CompressSpec(name, ratio=ratio)))


def test_first_reply_full_then_deltas_that_track_the_copy() -> None:
    pulls = _pulls("int8")
    dense = torch.tensor([1.0, -2.0, 3.0])
    t, flags = pulls.reply(0, dense, fresh=False)
    assert flags == 0 and torch.equal(t, dense) and torch.equal(pulls.held(0), dense)
    assert pulls.held(0) is not dense  # a copy, not the shard's live tensor
    held = dense.clone()
    new = dense + torch.tensor([0.5, 0.25, -1.0])
    t, flags = pulls.reply(0, new, fresh=False)
    assert flags == codec_flags(CompressSpec("int8"))
    held += decode_payload(flags, t, 3)
    assert torch.equal(held, pulls.held(0)) and torch.allclose(held, new, atol=0.01)
    assert pulls.matches(0, checksum(held)) and not pulls.matches(0, checksum(dense))
    assert not pulls.matches(1, checksum(held)) and pulls.held(1) is None
    t, flags = pulls.reply(0, new * 2, fresh=True)  # a restarted worker: whole again
    assert flags == 0 and torch.equal(t, new * 2) and torch.equal(pulls.held(0), new * 2)


def test_a_delta_beyond_the_range_is_clipped_and_a_non_finite_one_sent_whole() -> None:
    pulls = _pulls("int8")
    pulls.reply(0, torch.zeros(2), fresh=False)
    t, flags = pulls.reply(0, torch.tensor([3e38, -3e38]), fresh=False)
    got = decode_payload(flags, t, 2)
    assert torch.allclose(got, torch.tensor([FP32_LIMIT, -FP32_LIMIT]), rtol=1e-6)
    assert torch.equal(pulls.held(0), got)
    bad = torch.tensor([float("inf"), 1.0])
    t, flags = pulls.reply(0, bad, fresh=False)
    assert flags == 0 and torch.equal(t, bad)


def test_randk_replies_draw_new_indices() -> None:
    pulls = _pulls("randk", 0.5)
    pulls.reply(0, torch.zeros(8), fresh=False)
    seeds = [int(pulls.reply(0, torch.arange(8.0) * (i + 1), fresh=False)[0][0])
             for i in range(3)]
    assert len(set(seeds)) == 3 and all(s > 0 for s in seeds)


def test_decode_push_reads_the_codec_and_keeps_the_rest() -> None:
    rows = [torch.tensor([3]), torch.ones(2)]
    plain = [torch.ones(4), *rows]
    assert decode_push(0, plain, 4) == (plain, "")
    codec = make_codec(CompressSpec("fp16"))
    flags = codec_flags(CompressSpec("fp16")) | 2  # fp16 + HAS_ROWS
    out, bad = decode_push(flags, [codec.encode(torch.tensor([1.0, 2.0, 3.0, 4.0])), *rows], 4)
    assert bad == "" and out[0].dtype == torch.float32
    assert out[0].tolist() == [1.0, 2.0, 3.0, 4.0] and out[1:] == rows
    assert decode_push(flags, [], 4) == ([], "")  # nothing to decode: the shard says why
    t = [torch.zeros(3, dtype=torch.float16)]
    assert decode_push(flags, t, 4) == (t, "bad compressed gradient (not fp16[n])")
