"""Text data (tokens, the split by position, windows, bad input) and the GPT model
(shapes, causality, size, its recipe), in one process."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import phalanx
from phalanx.config import RunConfig
from phalanx.data import DataOptions, load_data
from phalanx.data.text import SHAKESPEARE, decode, tokenize, windows
from phalanx.errors import ConfigError, DataError
from phalanx.models import build_model, count_parameters, generate
from phalanx.parallel.registry import check_config


def test_shakespeare_is_split_by_position_and_windows_shift_by_one():
    train, test = load_data("shakespeare", options=DataOptions(context=64))
    text = SHAKESPEARE.read_text()
    assert train.task == test.task == "lm" and train.num_classes == 65 == len(train.vocab)
    info = train.info
    assert info["train_tokens"] + info["test_tokens"] == len(text)
    assert info["test_tokens"] == round(0.1 * len(text))
    # every window's target is its input shifted by one token
    assert torch.equal(train.x[:, 1:], train.y[:, :-1])
    # the test windows are the last 10% of the text, tiled without overlap
    first = decode(test.x[0].tolist(), test.vocab)
    assert text[info["train_tokens"]:].startswith(first)
    assert len(test) == (info["test_tokens"] - 1) // 64
    # no training window reaches into the test text
    last_start = decode(train.x[-1].tolist(), train.vocab) + decode(train.y[-1, -1:].tolist(),
                                                                     train.vocab)
    assert text[:info["train_tokens"]].endswith(last_start) or last_start in \
        text[:info["train_tokens"]]
    assert info["window_stride"] == 21 and abs(len(train) - info["train_tokens"] / 21) <= 21


def test_the_window_offset_is_seeded():
    a, _ = load_data("shakespeare", seed=1, options=DataOptions(context=32))
    b, _ = load_data("shakespeare", seed=1, options=DataOptions(context=32))
    assert torch.equal(a.x, b.x)
    firsts = {tuple(load_data("shakespeare", seed=s, options=DataOptions(context=32))[0].x[0,
                                                                                      :4].tolist())
              for s in range(6)}
    assert len(firsts) > 1  # offsets 0..7 drawn per seed


def test_characters_and_bytes():
    train, test, vocab = tokenize("abcab\u00e9" * 20 + "zz", "char")
    assert vocab.endswith("\ufffd")  # z is only in the test text: the unknown token
    assert decode(train[:6], vocab) == "abcab\u00e9"
    assert test[-1] == len(vocab) - 1
    train, test, vocab = tokenize("h\u00e9llo" * 20, "byte")
    assert vocab == "" and train.max() < 256
    assert decode(np.concatenate([train, test]), "") == "h\u00e9llo" * 20
    x, y = windows(np.arange(10), 3, 2)
    assert x.tolist() == [[0, 1, 2], [2, 3, 4], [4, 5, 6], [6, 7, 8]]
    assert y.tolist() == [[1, 2, 3], [3, 4, 5], [5, 6, 7], [7, 8, 9]]


@pytest.mark.parametrize(("content", "message"), [
    (b"", "empty"),
    (b"   \n\n", "empty"),
    (b"abc\x00def", "binary file"),
    (b"\xff\xfe\xfa text", "not UTF-8"),
])
def test_bad_text_files_are_one_line(tmp_path, content, message):
    path = tmp_path / "t.txt"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message) as e:
        load_data("text", str(path))
    assert "\n" not in str(e.value)


def test_text_folders_context_and_missing_paths(tmp_path):
    with pytest.raises(DataError, match="no .txt file"):
        load_data("text", str(tmp_path))
    (tmp_path / "b.txt").write_text("second part. " * 30)
    (tmp_path / "a.txt").write_text("first part. " * 30)
    train, _ = load_data("text", str(tmp_path), options=DataOptions(context=8))
    assert decode(train.x[0].tolist(), train.vocab) in "first part. " * 30  # a.txt first
    assert train.info["train_tokens"] + train.info["test_tokens"] == 12 * 30 + 1 + 13 * 30
    with pytest.raises(DataError, match="--context: 64 tokens is longer than the test text"):
        load_data("text", str(tmp_path / "a.txt"), options=DataOptions(context=64))
    with pytest.raises(DataError, match="needs --data-dir"):
        load_data("text")
    with pytest.raises(DataError, match="no such file"):
        load_data("text", str(tmp_path / "nope.txt"))


def test_flags_that_need_text_or_the_gpt_are_refused_elsewhere():
    for kw, flag in (({"context": 32}, "--context"), ({"tokens": "byte"}, "--tokens"),
                     ({"gpt_layers": 2}, "--gpt-layers"), ({"dropout": 0.1}, "--dropout")):
        from phalanx.parallel.registry import check_flags_apply
        cfg = check_config(RunConfig(data="synthetic", model="mlp", **kw))
        with pytest.raises(ConfigError, match=flag):
            check_flags_apply(cfg)
    with pytest.raises(ConfigError, match="--gpt-dim: 30 is not a multiple"):
        build_model("gpt", (8,), 10, dim=30, heads=4)


def test_a_model_for_images_on_text_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="mlp: takes images but .*shakespeare is text .*gpt"):
        phalanx.train("mlp", "shakespeare", out=str(tmp_path), progress=False)
    with pytest.raises(ConfigError, match="gpt: takes text .* but .*synthetic is images"):
        phalanx.train("gpt", "synthetic", out=str(tmp_path / "b"), progress=False)


def test_gpt_shapes_size_and_causality():
    model = build_model("gpt", (64,), 65)  # the default: 4 blocks, 4 heads, width 128
    assert 780_000 < count_parameters(model) < 850_000  # nanoGPT's CPU recipe, untied head
    assert [n for n, _ in model.named_children()] == \
        ["embed", "block0", "block1", "block2", "block3", "ln_f", "head"]
    model.eval()
    idx = torch.randint(0, 65, (2, 64), generator=torch.Generator().manual_seed(0))
    out = model(idx)
    assert out.shape == (2, 64, 65)
    # causal: changing token 40 changes no prediction before position 40
    changed = idx.clone()
    changed[:, 40] = (changed[:, 40] + 1) % 65
    out2 = model(changed)
    assert torch.equal(out[:, :40], out2[:, :40])
    assert not torch.allclose(out[:, 40:], out2[:, 40:])
    # the initial loss is that of a near-uniform guess: GPT-2's small init
    loss = torch.nn.functional.cross_entropy(out.reshape(-1, 65), idx.reshape(-1)).item()
    assert abs(loss - math.log(65)) < 0.1
    with pytest.raises(ValueError, match="longer than the context"):
        model(torch.zeros(1, 65, dtype=torch.long))


def test_generate_is_seeded_and_extends_the_prompt():
    model = build_model("gpt", (16,), 20, layers=1, dim=16, heads=2)
    prompt = torch.tensor([1, 2, 3])
    a = generate(model, prompt, 30, 16, seed=3)
    assert a.shape == (33,) and a[:3].tolist() == [1, 2, 3] and int(a.max()) < 20
    assert torch.equal(a, generate(model, prompt, 30, 16, seed=3))
    assert not torch.equal(a, generate(model, prompt, 30, 16, seed=4))



def test_generate_runs_on_one_thread_and_gives_the_count_back():
    # each token's operations are tiny: more threads only wait at each other's barriers
    # (six runs' samples at once on a 16-core machine, 16 threads each: past a minute)
    model = build_model("gpt", (16,), 20, layers=1, dim=16, heads=2)
    seen = []
    model.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a = generate(model, torch.tensor([1, 2, 3]), 5, 16, seed=3)
        assert len(seen) == 5 and set(seen) == {1}
        assert torch.get_num_threads() == 2 and model.training
        model.eval()
        generate(model, torch.tensor([1, 2, 3]), 1, 16, seed=3)
        assert not model.training  # the mode it was given back
        seen.clear()
        model.register_forward_pre_hook(lambda *_: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            generate(model, torch.tensor([1, 2, 3]), 5, 16, seed=3)
        assert torch.get_num_threads() == 2  # given back on an error too
        assert a.shape == (8,)
    finally:
        torch.set_num_threads(before)

def test_the_gpt_recipe_applies_only_when_the_user_chose_no_rule():
    cfg = check_config(RunConfig(model="gpt", data="shakespeare"))
    assert (cfg.rule, cfg.lr, cfg.schedule, cfg.warmup_steps, cfg.weight_decay) == \
        ("adamw", 2e-3, "constant", 100, 0.1)
    cfg = check_config(RunConfig(model="gpt", data="shakespeare", lr=0.01))
    assert (cfg.rule, cfg.schedule) == ("sgd", "constant")
    cfg = check_config(RunConfig(model="gpt", data="shakespeare", warmup_steps=5))
    assert (cfg.rule, cfg.warmup_steps) == ("adamw", 5)
    # a strategy with a step of its own (L-BFGS's 1) keeps it
    cfg = check_config(RunConfig(model="gpt", data="shakespeare", strategy="sandblaster"))
    assert cfg.lr == 1.0


def test_single_learns_characters_and_reports_lm_figures(tmp_path):
    r = phalanx.train("gpt", "shakespeare", gpt_layers=2, gpt_dim=32, gpt_heads=2, context=32,
                      batch_size=16, max_steps=60, lr=3e-3, rule="adamw", train_limit=2000,
                      test_limit=100, eval_every=30, out=str(tmp_path), progress=False,
                      tensorboard=False)
    s = r.summary
    assert s["test_loss"] < 3.3  # from ln 65 = 4.17 in 60 steps
    assert s["test_perplexity"] == pytest.approx(math.exp(s["test_loss"]))
    assert 0.1 < s["test_accuracy"] < 1
    assert s["train_tokens"] == s["train_samples"] * 32 == 60 * 16 * 32
    assert s["data_tokens"] == "char" and s["data_vocab_size"] == 65
    assert len(s["sample_text"]) >= 150  # 200 characters sampled after the prompt
    evals = [e for e in r.history if e["kind"] == "eval"]
    assert [e["step"] for e in evals] == [30, 60]
    assert all(e["test_perplexity"] == pytest.approx(math.exp(e["test_loss"])) for e in evals)
    assert any(e.get("kind") == "sample" for e in r.events)
