"""Every strategy in the registry trains a few steps on synthetic data through the same
API, with real processes where it starts them, and leaves the same kind of run folder.

A new strategy is in this suite by being in the registry: its spec's ``example`` holds the
settings of a small run (besides ``--workers 2``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import phalanx
from phalanx.config import RunConfig
from phalanx.metrics import read_events
from phalanx.parallel.registry import NAMES, STRATEGIES, check_config, spec


def small_run(name: str, out: Path) -> dict:
    s = spec(name)
    run = {"model": "mlp", "data": "synthetic", "strategy": name, "max_steps": 4,
           "batch_size": 32, "train_limit": 512, "test_limit": 256, "progress": False,
           "tensorboard": False, "out": str(out), "seed": 3,
           "workers": s.fixed_workers or 2, **s.example}
    # only settings the strategy reads (phalanx.train refuses the others, as the CLI does)
    return {k: v for k, v in run.items() if k not in s.unused}


@pytest.mark.parametrize("name", NAMES)
def test_every_strategy_trains_and_writes_its_run(tmp_path: Path, name: str) -> None:
    opts = small_run(name, tmp_path / name)
    result = phalanx.train(**opts)
    s = result.summary
    assert s["strategy"] == name and s["steps"] >= 1 and s["train_samples"] > 0
    assert math.isfinite(s["test_loss"]) and 0.0 <= s["test_accuracy"] <= 1.0
    on_disk = json.loads((tmp_path / name / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(s))  # written once, as returned
    config = json.loads((tmp_path / name / "config.json").read_text())
    assert config["strategy"] == name
    kinds = [e["kind"] for e in read_events(tmp_path / name / "events.jsonl")]
    assert kinds[0] == "start" and "summary" in kinds and "eval" in kinds
    # both throughput figures (docs/events.md): every strategy's ranks say when they are
    # ready, so start-up is measured apart from the steady-state rate
    assert "ready" in kinds
    assert s["samples_per_s"] > 0 and s["startup_s"] >= 0 and 0 < s["train_s"] < s["wall_s"]
    # peak memory of every process (a "memory" event as each rank ends; the driver's own)
    per = s["peak_rss_bytes_per_process"]
    assert "-1" in per and s["peak_rss_bytes"] == max(per.values()) > 10**7
    assert len(per) - 1 == sum(1 for k in kinds if k == "memory")
    # it trained: the weights moved away from the seed's initial model
    torch.manual_seed(opts["seed"])
    init = phalanx.entry.api.make_job(RunConfig(**{k: v for k, v in opts.items()
                                                    if k != "model"}),
                                       opts["model"]).build_model()
    moved = sum(float((a - b).abs().sum()) for a, b in
                zip(result.model.state_dict().values(), init.state_dict().values()))
    assert moved > 0


@pytest.mark.parametrize("name", NAMES)
def test_every_spec_is_consistent(name: str) -> None:
    s = STRATEGIES[name]
    cfg = check_config(RunConfig(**{k: v for k, v in small_run(name, Path("x")).items()
                                    if k != "model"}))
    assert s.world_size(cfg) >= 1
    ranks, flags = s.compute_ranks(cfg)
    assert ranks >= 1 and flags.startswith("--")
    assert s.device.cuda or s.device.reason  # a CUDA path, or one line saying why not
    assert s.process_main is not None or s.local_only or s.world_size(cfg) == 1
    assert s.summary and "\n" not in s.summary
    if s.can_restart is not None:
        assert s.can_resume  # a torchrun restart continues from what --resume reads
