"""The compression layer's logic in one process: spec parsing, codecs and their byte
formulas, error feedback, the PS payload decoder, validation of the flags."""

from __future__ import annotations

import pytest
import torch

from phalanx.cli import main
from phalanx.comm.compress import (
    CompressSpec,
    DecodeError,
    ErrorFeedback,
    codec_flags,
    decode_payload,
    kept,
    make_codec,
    parse_compress,
)
from phalanx.comm.exchange import Compression
from phalanx.comm.powersgd import orthogonalize_
from phalanx.config import RunConfig
from phalanx.errors import ConfigError
from phalanx.parallel.registry import check_config

CODECS = ["none", "fp16", "bf16", "int8", "topk:0.01", "topk:0.3", "randk:0.05", "randk:1"]


def test_parse() -> None:
    assert parse_compress("topk:0.01") == CompressSpec("topk", ratio=0.01)
    assert parse_compress("powersgd:4") == CompressSpec("powersgd", rank=4)
    assert parse_compress("powersgd:2,start=2,warm") == CompressSpec("powersgd", rank=2,
                                                                     start=2, warm=True)
    assert str(parse_compress("randk:0.5")) == "randk:0.5"


@pytest.mark.parametrize("bad", ["zip", "topk", "topk:0", "topk:-1", "topk:1.5", "randk:nan",
                                 "randk:x", "powersgd:0", "powersgd:-2", "powersgd:x",
                                 "powersgd:2,foo", "fp16:3"])
def test_bad_specs(bad: str) -> None:
    with pytest.raises(ConfigError, match="^--compress"):
        parse_compress(bad)


@pytest.mark.parametrize("kw,match", [
    ({"strategy": "single", "compress": "fp16"}, "--compress: strategy 'single'"),
    ({"strategy": "hogwild", "workers": 2, "compress": "topk:0.1"}, "--compress"),
    ({"strategy": "pipeline", "compress": "int8"}, "--compress"),
    ({"strategy": "model-parallel", "compress": "int8"}, "--compress"),
    ({"strategy": "asp", "workers": 2, "compress": "powersgd:2"}, "needs an allreduce"),
    ({"strategy": "sync", "workers": 2, "outer_rule": "sgd"}, "--outer-rule"),
    ({"strategy": "average", "workers": 2, "outer_rule": "adam"}, "--outer-rule"),
    ({"strategy": "average", "workers": 2, "outer_rule": "sgd", "outer_lr": 0.0}, "--outer-lr"),
    ({"strategy": "average", "workers": 2, "outer_momentum": 1.0}, "--outer-momentum"),
])
def test_bad_config(kw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        check_config(RunConfig(**kw))
    check_config(RunConfig(**{**kw, "compress": "none", "outer_rule": "", "outer_lr": 1.0,
                              "outer_momentum": 0.9}))  # the rest of it is fine


@pytest.mark.parametrize("flags", [["--compress", "topk:0"],
                                   ["--strategy", "single", "--compress", "fp16"]])
def test_cli_one_line_exit_2(flags: list[str], tmp_path, capsys) -> None:
    # in-process: the real-process path of a bad flag is tests/e2e/test_cli.py's
    code = main(["train", "--strategy", "sync", "--workers", "2", "--data", "synthetic",
                 *flags, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("phalanx: error: --compress"), err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("text", CODECS)
@pytest.mark.parametrize("n", [1, 7, 1000])
def test_codec_bytes_and_roundtrip(text: str, n: int) -> None:
    spec = parse_compress(text)
    codec = make_codec(spec)
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    t = codec.encode(x)
    assert t.numel() * t.element_size() == codec.payload_bytes(n)  # the formula is exact
    y = codec.decode(t, n)
    assert y.shape == x.shape and y.dtype == torch.float32
    if spec.name == "none":
        assert torch.equal(x, y)
    elif spec.name in ("fp16", "bf16"):
        assert (x - y).abs().max() <= x.abs().max() * (2**-8 if spec.name == "bf16" else 2**-11)
    elif spec.name == "int8":
        assert (x - y).abs().max() <= x.abs().max() / 127 / 2 + 1e-7
    else:
        k = kept(spec.ratio, n)
        nz = y != 0
        assert int(nz.sum()) == k and torch.equal(y[nz], x[nz])
        if spec.name == "topk" and k < n:  # the kept ones are the largest magnitudes
            assert x[nz].abs().min() >= x[~nz].abs().max()
    # the PS decoder reads the codec from the header flags alone
    if spec.name != "none":
        assert torch.equal(decode_payload(codec_flags(spec), t, n), y)


def test_decoder_rejects_hostile_payloads() -> None:
    topk = codec_flags(CompressSpec("topk"))
    bad = [
        (topk, torch.tensor([5, 0], dtype=torch.int32), 4),  # index out of range
        (topk, torch.tensor([0, 1, 2], dtype=torch.int32), 4),  # odd length
        (topk, torch.zeros(2, dtype=torch.float32), 4),  # wrong dtype
        (codec_flags(CompressSpec("fp16")), torch.zeros(3, dtype=torch.float16), 4),
        (codec_flags(CompressSpec("int8")), torch.zeros(3, dtype=torch.int8), 4),
        (codec_flags(CompressSpec("randk")), torch.tensor([-1, 0], dtype=torch.int32), 4),
        (codec_flags(CompressSpec("fp16")), torch.tensor([float("inf")] * 4).half(), 4),
        (7 << 3, torch.zeros(4), 4),  # unknown codec
    ]
    for flags, t, n in bad:
        with pytest.raises(DecodeError):
            decode_payload(flags, t, n)


@pytest.mark.parametrize("text", ["topk:0.1", "randk:0.1", "int8", "bf16"])
def test_error_feedback_loses_nothing(text: str) -> None:
    """With error feedback, what was sent plus the residual is exactly what went in."""
    comp = Compression(parse_compress(text), error_feedback=True)
    gen = torch.Generator().manual_seed(0)
    total_in, total_sent = torch.zeros(50), torch.zeros(50)
    for step in range(20):
        x = torch.randn(50, generator=gen)
        t = comp.encode(x, key=0, seed=step)
        total_in += x
        total_sent += comp.codec.decode(t, 50)
    assert torch.allclose(total_sent + comp.feedback.residual[0], total_in, atol=1e-5)
    off = Compression(parse_compress(text), error_feedback=False)
    off.encode(torch.randn(50), key=0)
    assert off.feedback.residual == {}


def test_error_feedback_off_for_none() -> None:
    assert not ErrorFeedback(False).enabled
    assert not Compression(parse_compress("none"), True).feedback.enabled


@pytest.mark.parametrize("rank", [1, 2, 4])
def test_orthogonalize(rank: int) -> None:
    m = torch.randn(3, 20, rank, generator=torch.Generator().manual_seed(rank))
    orthogonalize_(m)
    eye = torch.eye(rank).expand(3, rank, rank)
    assert torch.allclose(m.transpose(1, 2) @ m, eye, atol=1e-5)
