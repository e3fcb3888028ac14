"""Single-worker training through the Python API: outputs, determinism, the oracle loop."""

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import phalanx
from phalanx.config import RunConfig
from phalanx.data import epoch_batches, load_data
from phalanx.errors import ConfigError
from phalanx.parallel.registry import check_config
from phalanx.runtime.checkpoint import load_checkpoint


def test_single_writes_outputs_and_learns(tmp_path):
    r = phalanx.train("mlp", "synthetic", epochs=2, lr=0.05, out=str(tmp_path), progress=False,
                      tensorboard=False)
    for name in ("config.json", "events.jsonl", "summary.json", "checkpoint.pt"):
        assert (tmp_path / name).is_file(), name
    s = json.loads((tmp_path / "summary.json").read_text())
    for key in ("test_accuracy", "test_loss", "train_samples", "wall_s", "samples_per_s"):
        assert key in s
    assert s["test_accuracy"] > 0.5  # 10 classes: chance is 0.1
    assert {e["kind"] for e in r.events} >= {"start", "ready", "train", "eval", "summary"}
    assert {e["kind"] for e in r.history} == {"train", "eval"}  # the curve, not the summary
    assert r.history[-1]["kind"] == "eval" and r.summary["steps"] == r.history[-2]["step"]
    evals = [e for e in r.history if e["kind"] == "eval"]
    assert len(evals) == 2 and all("test_accuracy" in e and "wall_s" in e for e in evals)
    ckpt = load_checkpoint(tmp_path / "checkpoint.pt")
    assert ckpt["step"] == s["steps"]


def test_same_seed_same_result(tmp_path):
    kw = dict(epochs=1, max_steps=20, progress=False, tensorboard=False)
    a = phalanx.train("mlp", "synthetic", out=str(tmp_path / "a"), seed=5, **kw)
    b = phalanx.train("mlp", "synthetic", out=str(tmp_path / "b"), seed=5, **kw)
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(p, q)


def test_matches_a_plain_pytorch_loop(tmp_path):
    """Oracle: our loop with momentum equals a hand-written loop with torch.optim.SGD."""
    r = phalanx.train("mlp", "synthetic", rule="momentum", lr=0.01, momentum=0.9, epochs=1,
                      max_steps=30, batch_size=32, seed=3, out=str(tmp_path), progress=False,
                      tensorboard=False)
    train, _ = load_data("synthetic", seed=3)
    from phalanx.models import build_model

    torch.manual_seed(3)
    model = build_model("mlp", train.input_shape, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    from phalanx.data import shard_indices

    shard = shard_indices(train.y, 0, 1, 3)
    for i, idx in enumerate(epoch_batches(shard, 32, 0, 3)):
        if i == 30:
            break
        opt.zero_grad()
        nn.functional.cross_entropy(model(train.x[idx]), train.y[idx]).backward()
        opt.step()
    diff = max((p - q).abs().max().item() for p, q in zip(r.model.parameters(),
                                                           model.parameters()))
    assert diff < 1e-5


def test_grad_accumulation_equals_larger_batch(tmp_path):
    kw = dict(epochs=1, max_steps=10, progress=False, tensorboard=False, seed=1, lr=0.05)
    big = phalanx.train("mlp", "synthetic", batch_size=64, out=str(tmp_path / "a"), **kw)
    acc = phalanx.train("mlp", "synthetic", batch_size=32, grad_accum=2,
                        out=str(tmp_path / "b"), **kw)
    # same samples in the same order: two micro-batches of 32 = one batch of 64
    diff = max((p - q).abs().max().item() for p, q in zip(big.model.parameters(),
                                                           acc.model.parameters()))
    assert diff < 1e-5


def test_custom_module_factory(tmp_path):
    def tiny():
        return nn.Sequential(nn.Flatten(), nn.Linear(256, 10))

    r = phalanx.train(tiny, "synthetic", epochs=1, out=str(tmp_path), progress=False,
                      tensorboard=False)
    assert r.summary["test_accuracy"] > 0.3


def test_bad_options_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown setting 'bogus'"):
        phalanx.train("mlp", "synthetic", bogus=1, out=str(tmp_path))
    with pytest.raises(ConfigError, match="batch_size: 0"):
        phalanx.train("mlp", "synthetic", batch_size=0, out=str(tmp_path))
    with pytest.raises(ConfigError, match="lenet5: needs images of at least 12x12"):
        phalanx.train("lenet5", "digits", out=str(tmp_path))


def test_config_validation_messages():
    with pytest.raises(ConfigError, match="--slow-workers: rank 3 does not exist"):
        check_config(RunConfig(workers=2, slow_workers={3: 2.0}))
    with pytest.raises(ConfigError, match="--softsync"):
        RunConfig(workers=2, softsync=3).validate()
    with pytest.raises(ConfigError, match="is not a valid int"):
        RunConfig.from_mapping({"workers": "two"})
    with pytest.raises(ConfigError, match="is not a valid bool"):
        RunConfig.from_mapping({"sfb": "maybe"})
    cfg = RunConfig.from_mapping({"slow-workers": "0:3.0,1:1.5", "workers": 2}).validate()
    assert cfg.slow_workers == {0: 3.0, 1: 1.5}


def test_slow_worker_ranks_follow_the_strategy_world():
    check_config(RunConfig(strategy="hybrid", stages=2, replicas=2, slow_workers={3: 2.0}))
    check_config(RunConfig(strategy="pipeline", stages=3, slow_workers={2: 2.0}))
    with pytest.raises(ConfigError, match="rank 4 does not exist with --stages 2 x --replicas 2"):
        check_config(RunConfig(strategy="hybrid", stages=2, replicas=2, slow_workers={4: 2.0}))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine's message")
def test_cuda_requested_without_a_gpu(tmp_path):
    with pytest.raises(ConfigError, match="device=cuda: no CUDA device"):
        phalanx.train("mlp", "synthetic", device="cuda", out=str(tmp_path))


def test_api_errors_name_keyword_arguments_not_flags(tmp_path):
    """phalanx.train speaks Python: its one-line errors name keywords (issue 27)."""

    kw = dict(max_steps=2, progress=False, tensorboard=False, out=str(tmp_path))
    phalanx.train("mlp", "synthetic", **kw)
    with pytest.raises(ConfigError) as e:
        phalanx.train("mlp", "synthetic", **kw)  # the folder holds a run now
    assert "overwrite=True" in str(e.value) and f"out={tmp_path}" in str(e.value)
    assert "--" not in str(e.value)
    with pytest.raises(ConfigError, match=r"^epochs: "):
        phalanx.train("mlp", "synthetic", epochs=0, out=str(tmp_path / "b"))
    assert phalanx.as_keywords("--no-progress, --strategies") == "progress=False, --strategies"
    assert "Returns:" in phalanx.train.__doc__ and "Example" in phalanx.train.__doc__


@pytest.mark.parametrize("factory,message", [
    (lambda *a: 42, "model: the factory returned 42 (int), not an nn.Module"),
    (lambda *a: torch.nn.ReLU(), "model: the factory's ReLU has no trainable parameters: "
                                 "nothing to train"),
])
def test_a_bad_model_factory_is_one_line_and_writes_nothing(tmp_path, factory, message):
    out = tmp_path / "run"
    with pytest.raises(ConfigError) as e:
        phalanx.train(factory, "synthetic", strategy="single", out=str(out), progress=False)
    assert str(e.value) == message
    assert not out.exists() or not any(out.iterdir())  # a retry is not refused


def test_the_api_refuses_a_setting_the_strategy_ignores_as_the_cli_does(tmp_path):
    with pytest.raises(ConfigError) as e:
        phalanx.train("mlp", strategy="single", dc_lambda=0.5, out=str(tmp_path / "r"))
    assert str(e.value) == "dc_lambda: strategy=single does not use it (only dc-asgd); drop it"


def test_a_folder_without_checkpoint_is_not_offered_for_resume(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError) as e:
        phalanx.train("mlp", "synthetic", strategy="single", out=str(tmp_path))
    assert str(e.value).endswith("not empty (config.json); add overwrite=True to replace that "
                                 "run (it holds no checkpoint to resume)"), str(e.value)


def test_start_and_end_are_compared_on_the_same_first_test_samples(tmp_path):
    """The untrained model is evaluated on the test set's first 1,000 samples only (not all
    10,000 of Fashion-MNIST: every run pays it), and the trained one on the same samples
    for ``worse_than_start``; ``test_loss`` stays the whole set's."""
    from phalanx.entry.api import make_job
    from phalanx.parallel.base import evaluate

    if not Path("/usr/share/datasets/fashion-mnist").is_dir():
        pytest.skip("Fashion-MNIST is not installed (dataset-fashion-mnist)")
    r = phalanx.train("mlp", "fashion-mnist", max_steps=20, lr=0.05, out=str(tmp_path / "r"),
                      progress=False, tensorboard=False)
    s = r.summary
    job = make_job(RunConfig(model="mlp", data="fashion-mnist", out=str(tmp_path / "j")))
    first = job.test.subset(1000)
    assert len(job.test) == 10_000 and s["start_samples"] == 1000
    assert s["initial_test_loss"] == evaluate(job.build_model(), first)[0]
    assert s["start_samples_test_loss"] == evaluate(r.model, first)[0]
    assert s["test_loss"] == evaluate(r.model, job.test)[0] != s["start_samples_test_loss"]
    assert s["start_samples_test_loss"] < s["initial_test_loss"] and not s["worse_than_start"]
