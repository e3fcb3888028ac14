"""The compression layer's edges, exactly: every one-line message a user or a hostile peer
can cause, names and dtypes of the codecs, a spec printed and parsed back, clipping on
both sides, the residual dropped (never kept) when it would be non-finite. Written against
the survivors of ``make mutate`` (docs/compression.md)."""

from __future__ import annotations

import math

import pytest
import torch

from phalanx.comm.compress import (
    FP32_LIMIT,
    CompressSpec,
    DecodeError,
    ErrorFeedback,
    check_compression,
    checksum,
    codec_flags,
    decode_payload,
    finite,
    kept,
    make_codec,
    parse_compress,
)
from phalanx.comm.exchange import Compression
from phalanx.config import RunConfig
from phalanx.errors import ConfigError

HONOURED = {"compress": ("sync", "average", "asp"), "powersgd": ("sync", "average"),
            "outer_rule": ("average",), "compress_checkpoint": ("sync", "average")}


@pytest.mark.parametrize("text,message", [
    ("zip", "--compress: 'zip' is not one of none, fp16, bf16, int8, topk:RATIO, "
            "randk:RATIO, powersgd:RANK"),
    ("topk:x", "--compress: 'topk:x' needs a ratio, e.g. topk:0.01"),
    ("randk:2", "--compress: 'randk:2': the ratio must be in (0, 1]"),
    ("powersgd:r", "--compress: 'powersgd:r' needs a rank, e.g. powersgd:2"),
    ("powersgd:0", "--compress: 'powersgd:0': the rank must be >= 1"),
    ("powersgd:2,start=x", "--compress: 'powersgd:2,start=x': unknown powersgd option "
                           "'start=x' (start=N or warm)"),
    ("powersgd:2,warm=1", "--compress: 'powersgd:2,warm=1': unknown powersgd option "
                          "'warm=1' (start=N or warm)"),
    ("powersgd:2,3", "--compress: 'powersgd:2,3': unknown powersgd option '3' "
                     "(start=N or warm)"),
    ("int8:1", "--compress: 'int8:1': int8 takes no argument"),
])
def test_parse_messages(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_compress(text)
    assert str(e.value) == message


@pytest.mark.parametrize("text", ["none", "fp16", "bf16", "int8", "topk:0.25", "randk:1",
                                  "powersgd:3", "powersgd:2,start=4", "powersgd:1,warm",
                                  "powersgd:2,start=1,warm"])
def test_a_spec_prints_as_it_parses(text: str) -> None:
    spec = parse_compress(text)
    assert str(spec) == text and parse_compress(str(spec)) == spec


@pytest.mark.parametrize("kw,message", [
    ({"strategy": "hogwild", "compress": "fp16"},
     "--compress: strategy 'hogwild' does not compress its traffic (compression applies to "
     "sync, average, asp)"),
    ({"strategy": "asp", "compress": "powersgd:2"},
     "--compress: 'powersgd:2' needs an allreduce group (two rounds per step); a "
     "parameter-server push is one message: use sync or average"),
    ({"strategy": "asp", "compress": "int8", "checkpoint_every": 5},
     "--compress: asp's checkpoints do not hold the error-feedback residuals (those of sync, "
     "average do); drop --checkpoint-every or --compress"),
    ({"strategy": "average", "outer_rule": "adam"},
     "--outer-rule: 'adam' is not one of sgd, nesterov"),
    ({"strategy": "sync", "outer_rule": "sgd"},
     "--outer-rule: the DiLoCo outer optimizer needs --strategy average"),
    ({"strategy": "average", "outer_rule": "sgd", "checkpoint_every": 5},
     "--outer-rule: checkpoints do not hold the outer optimizer's state yet; drop "
     "--checkpoint-every"),
    ({"strategy": "average", "outer_lr": float("inf")},
     "--outer-lr: inf must be a finite number > 0"),
    ({"strategy": "average", "outer_lr": 0.0}, "--outer-lr: 0.0 must be a finite number > 0"),
    ({"strategy": "average", "outer_momentum": 1.0},
     "--outer-momentum: 1.0 must be in [0, 1)"),
    ({"strategy": "average", "outer_momentum": -0.1},
     "--outer-momentum: -0.1 must be in [0, 1)"),
])
def test_flag_messages(kw: dict, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        check_compression(RunConfig(**kw), HONOURED)
    assert str(e.value) == message


@pytest.mark.parametrize("kw", [{"strategy": "sync", "compress": "powersgd:2"},
                                {"strategy": "asp", "compress": "topk:0.1"},
                                {"strategy": "hogwild"},
                                {"strategy": "average", "outer_rule": "nesterov",
                                 "outer_momentum": 0.0},
                                {"strategy": "sync", "checkpoint_every": 5},
                                {"strategy": "sync", "compress": "int8",
                                 "checkpoint_every": 5},
                                {"strategy": "average", "compress": "powersgd:1",
                                 "checkpoint_every": 4, "period": 2}])
def test_flags_that_are_fine(kw: dict) -> None:
    check_compression(RunConfig(**kw), HONOURED)


def test_codec_names_dtypes_and_the_powersgd_refusal() -> None:
    fp16, bf16 = make_codec(CompressSpec("fp16")), make_codec(CompressSpec("bf16"))
    assert (fp16.name, fp16.dtype, fp16.limit) == ("fp16", torch.float16, 65504.0)
    assert (bf16.name, bf16.dtype) == ("bf16", torch.bfloat16)
    assert [make_codec(CompressSpec(n)).limit for n in ("none", "int8", "topk", "randk")] == \
        [FP32_LIMIT] * 4
    with pytest.raises(ConfigError) as e:
        make_codec(CompressSpec("powersgd", rank=2))
    assert str(e.value) == ("--compress: powersgd:2 has no single-message codec (it needs an "
                            "allreduce)")


@pytest.mark.parametrize("flags,t,n,reason", [
    (0, torch.zeros(4), 4, "unknown codec"),
    (6 << 3, torch.zeros(4), 4, "unknown codec"),
    (7 << 3, torch.zeros(4), 4, "unknown codec"),
    (1 << 3, torch.zeros(3, dtype=torch.float16), 4, "not fp16[n]"),
    (2 << 3, torch.zeros(4, dtype=torch.float16), 4, "not bf16[n]"),
    (3 << 3, torch.zeros(7, dtype=torch.int8), 4, "not int8[n + 4]"),
    (3 << 3, torch.cat([torch.tensor([-1.0]).view(torch.int8), torch.ones(4, dtype=torch.int8)]),
     4, "bad int8 scale"),
    (3 << 3, torch.cat([torch.tensor([float("nan")]).view(torch.int8),
                        torch.ones(4, dtype=torch.int8)]), 4, "bad int8 scale"),
    (4 << 3, torch.tensor([0, 1, 2], dtype=torch.int32), 4, "not int32[2k]"),
    (4 << 3, torch.tensor([0, 1, 2, 3, 4, 5], dtype=torch.int32), 2, "not int32[2k]"),
    (4 << 3, torch.tensor([4, 0], dtype=torch.int32), 4, "index out of range"),
    (4 << 3, torch.tensor([-1, 0], dtype=torch.int32), 4, "index out of range"),
    (5 << 3, torch.tensor([-1, 0], dtype=torch.int32), 4, "not int32[k + 1]"),
    (5 << 3, torch.tensor([1, 0, 0], dtype=torch.int32), 1, "not int32[k + 1]"),
    (5 << 3, torch.zeros(2), 4, "not int32[k + 1]"),
    (1 << 3, torch.tensor([float("inf"), 0.0]).half(), 2, "NaN or Inf in the payload"),
])
def test_hostile_payload_reasons(flags: int, t: torch.Tensor, n: int, reason: str) -> None:
    with pytest.raises(DecodeError) as e:
        decode_payload(flags, t, n)
    assert str(e.value) == reason


def test_identity_refuses_the_wrong_dtype_or_length() -> None:
    ident = make_codec(CompressSpec("none"))
    for bad in (torch.zeros(4, dtype=torch.float64), torch.zeros(3)):
        with pytest.raises(DecodeError) as e:
            ident.decode(bad, 4)
        assert str(e.value) == "not float32[n]"


def test_small_and_empty_messages_decode() -> None:
    topk, randk = make_codec(CompressSpec("topk", ratio=0.5)), \
        make_codec(CompressSpec("randk", ratio=0.5))
    assert torch.equal(topk.decode(topk.encode(torch.zeros(0)), 0), torch.zeros(0))
    assert torch.equal(randk.decode(randk.encode(torch.zeros(0)), 0), torch.zeros(0))
    # one kept value of one: k = 1 = numel
    assert torch.equal(randk.decode(randk.encode(torch.tensor([3.0])), 1), torch.tensor([3.0]))
    # a repeated top-k index (a peer may send one) adds up
    t = torch.cat([torch.tensor([1, 1], dtype=torch.int32),
                   torch.tensor([1.5, 2.0]).view(torch.int32)])
    assert torch.equal(topk.decode(t, 3), torch.tensor([0.0, 3.5, 0.0]))
    int8 = make_codec(CompressSpec("int8"))
    assert torch.equal(int8.decode(int8.encode(torch.zeros(0)), 0), torch.zeros(0))
    z = int8.encode(torch.zeros(5))
    assert torch.equal(z[4:], torch.zeros(5, dtype=torch.int8))
    assert torch.equal(int8.decode(z, 5), torch.zeros(5))
    q = int8.encode(torch.tensor([-2.0, 2.0, 1.0]))[4:]
    assert q.tolist() == [-127, 127, 64]


def test_randk_seeds_are_31_bit_and_travel() -> None:
    randk = make_codec(CompressSpec("randk", ratio=0.5))
    x = torch.arange(10.0)
    default, one = randk.encode(x), randk.encode(x, 1)
    assert int(default[0]) == 0 and int(one[0]) == 1
    big = randk.encode(x, 2**31 + 5)
    assert int(big[0]) == 5
    assert torch.equal(randk.decode(big, 10), randk.decode(randk.encode(x, 5), 10))
    assert kept(0.5, 10) == 5 and kept(0.01, 5) == 1 and kept(0.3, 0) == 0 and kept(1, 3) == 3


def test_topk_keeps_the_largest_magnitudes_whatever_their_sign() -> None:
    topk = make_codec(CompressSpec("topk", ratio=0.4))
    x = torch.tensor([0.1, -5.0, 0.2, 4.0, -0.3])
    assert torch.equal(topk.decode(topk.encode(x), 5), torch.tensor([0, -5.0, 0, 4.0, 0]))


def test_half_precision_clips_on_both_sides() -> None:
    fp16 = make_codec(CompressSpec("fp16"))
    got = fp16.decode(fp16.encode(torch.tensor([-1e6, 1e6, 7e4, 1.0])), 4)
    assert got.tolist() == [-65504.0, 65504.0, 65504.0, 1.0]


def test_a_non_finite_residual_is_dropped_not_kept() -> None:
    fb = ErrorFeedback(True)
    fb.keep("a", torch.ones(3), torch.zeros(3))
    fb.keep("b", torch.ones(3), torch.zeros(3))
    assert fb.dropped == 0 and torch.equal(fb.residual["a"], torch.ones(3))
    fb.keep("a", torch.ones(3), torch.tensor([0.0, float("inf"), 0.0]))
    assert "a" not in fb.residual and "b" in fb.residual and fb.dropped == 1
    fb.keep("a", torch.ones(3), torch.tensor([float("nan"), 0.0, 0.0]))
    assert fb.dropped == 2
    off = ErrorFeedback(False)
    off.keep("a", torch.ones(3), torch.zeros(3))
    assert off.residual == {} and torch.equal(off.add("a", torch.ones(2)), torch.ones(2))


def test_finite_and_checksum() -> None:
    assert finite(torch.zeros(0)) and finite(torch.tensor([2.0])) and finite(torch.ones(3))
    assert not finite(torch.tensor([float("nan")]))
    assert not finite(torch.tensor([1.0, -float("inf")]))
    # the sum is only a first test: finite values whose sum overflows are still finite,
    # and +inf with -inf (a NaN sum) is not
    big = torch.full((4,), 3e38)
    assert not math.isfinite(float(big.sum())) and finite(big)
    assert not finite(torch.tensor([float("inf"), -float("inf")]))
    assert not finite(torch.tensor([3e38, 3e38, float("nan")]))
    a = torch.tensor([1.0, 2.0, 3.0])
    assert checksum(a) == checksum(a.clone()) and checksum(a) != checksum(a.flip(0))
    b = a.clone()
    b[1] = torch.nextafter(b[1], torch.tensor(9.0))  # one bit
    assert checksum(a) != checksum(b)
    assert codec_flags(CompressSpec("none")) == 0 and codec_flags(CompressSpec("randk")) == 40


def test_features_no_strategy_declares() -> None:
    """A feature missing from the registry's map is honoured by no strategy (never a
    TypeError), and several strategies are named with 'or'."""
    for kw in ({"strategy": "sync", "compress": "int8"},
               {"strategy": "average", "outer_rule": "sgd"}):
        with pytest.raises(ConfigError):
            check_compression(RunConfig(**kw), {})
    with pytest.raises(ConfigError) as e:
        check_compression(RunConfig(strategy="sync", compress="powersgd:1"),
                          {"compress": ("sync",)})
    assert str(e.value).endswith("a parameter-server push is one message: use ")
    with pytest.raises(ConfigError) as e:
        check_compression(RunConfig(strategy="sync", outer_rule="sgd"),
                          {"outer_rule": ("average", "diloco")})
    assert str(e.value) == ("--outer-rule: the DiLoCo outer optimizer needs --strategy "
                            "average or diloco")


# ---- the compression state a checkpoint carries (read back from a file: checked) ------------

def _used(spec: str = "topk:0.25") -> Compression:
    comp = Compression(parse_compress(spec))
    torch.manual_seed(0)
    for key in (0, "parameter delta", 0):
        comp.encode(torch.randn(8), key)
    return comp


def test_compression_state_round_trips_exactly() -> None:
    comp = _used()
    fresh = Compression(parse_compress("topk:0.25"))
    fresh.load_state(comp.state_tensors())
    assert list(fresh.sizes) == [0, "parameter delta"]
    assert all(torch.equal(fresh.feedback.residual[k], comp.feedback.residual[k])
               for k in (0, "parameter delta"))
    x = torch.randn(8)
    assert torch.equal(fresh.encode(x, 0), comp.encode(x, 0))  # the next message equal


def _bad(tensors: list[torch.Tensor], i: int, value: torch.Tensor) -> list[torch.Tensor]:
    return [value if j == i else t for j, t in enumerate(tensors)]


@pytest.mark.parametrize("change,reason", [
    (lambda t: t[:2], "too short"),
    (lambda t: _bad(t, 0, torch.tensor(list(b"[0, 0]"), dtype=torch.uint8)), "bad keys"),
    (lambda t: _bad(t, 0, torch.tensor(list(b"{nope"), dtype=torch.uint8)), "bad keys"),
    (lambda t: _bad(t, 1, t[1][:1]), "bad key table"),
    (lambda t: _bad(t, 1, -t[1] - 1), "bad key table"),
    (lambda t: _bad(t, 2, torch.zeros(3, dtype=torch.int64)), "bad counters"),
    (lambda t: _bad(t, 3, t[3].double()), "bad residuals"),
    (lambda t: [*t, torch.zeros(1)], "too long"),
])
def test_a_bad_compression_state_is_refused_naming_it(change, reason: str) -> None:
    with pytest.raises(ValueError) as e:
        Compression(parse_compress("topk:0.25")).load_state(change(_used().state_tensors()))
    assert str(e.value) == f"compression state: {reason}"
