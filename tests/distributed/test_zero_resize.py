"""The live scheduler's resize of a zero job, through zero's own hook (``StrategySpec.resize``,
``parallel/zero_resize.py``; issue 47 item 1, issue 48 item 4), with real processes:

a zero-3 run on 2 workers (batch 16) is stopped after its checkpoint at step 6, resized to
3 workers of batch 8 by ``phalanx.entry.resize.resize_run`` (what ``phalanx schedule
--policy goodput`` calls), resumed with ``--resume`` and trained on to its last step: the
position is converted in epochs, the shards are carried over value for value under the
new step's name, the resume re-cuts them for 3 ranks, and the loss goes on from the
checkpoint's model and keeps falling. A strategy without a hook is refused in one line.
"""

from __future__ import annotations

import json

import pytest
import torch

import phalanx
from phalanx.config import RunConfig
from phalanx.data import same_place, steps_per_epoch
from phalanx.entry.api import make_job
from phalanx.entry.resize import resize_run, run_config
from phalanx.errors import ConfigError
from phalanx.metrics import read_events
from phalanx.parallel.zero_checkpoint import read, shard_path
from phalanx.runtime.launch import WorkerFailed

TINY = {"model": "gpt", "gpt_layers": 2, "gpt_dim": 32, "gpt_heads": 2, "context": 32,
        "data": "shakespeare", "train_limit": 4000, "test_limit": 200, "max_steps": 40,
        "rule": "adamw", "lr": 3e-3, "workers": 2, "batch_size": 16, "seed": 1,
        "progress": False, "tensorboard": False, "strategy": "zero", "zero_stage": 3,
        "allreduce": "ring", "checkpoint_every": 12}


def test_a_zero_3_run_resized_2_to_3_workers_resumes_and_trains_on(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(WorkerFailed, match="killed at step 12"):
        phalanx.train(out=str(run), kill_worker="1@12", **TINY)
    old = run_config(run)
    old.resume = str(run)
    _, before = read(old)

    assert resize_run(run, 3, 8) == (12, step := _converted(12, old))
    # the position in epochs: 12 steps of 2 x 16 are 16 of 3 x 8 on these windows
    assert step == 16
    cfg = json.loads((run / "config.json").read_text())
    assert (cfg["workers"], cfg["batch_size"], cfg["lr"]) == (3, 8, 3e-3)  # adamw's lr stays
    new = run_config(run)
    new.resume = str(run)
    manifest, after = read(new)  # the new settings' fingerprint, every shard at its step
    assert (manifest["step"], manifest["workers"]) == (16, 2)  # 2 shards, re-cut on resume
    assert not shard_path(run, 12, 0).exists() and not shard_path(run, 12, 1).exists()
    for b, a in zip(before, after):  # carried over value for value
        assert all(torch.equal(x, y) for x, y in zip(b["masters"], a["masters"]))
        assert all(torch.equal(x, y) for x, y in zip(b["state"], a["state"]))

    result = phalanx.train(resume=str(run), progress=False)
    assert result.summary["steps"] == 40 and len(result.summary["held_bytes_per_rank"]) == 3
    events = list(read_events(run / "events.jsonl"))
    assert [(e["step"], e["workers_saved"]) for e in events
            if e["kind"] == "resume" and e["rank"] == 0] == [(16, 2)]
    loss = {e["step"]: e["loss"] for e in events if e["kind"] == "train" and e["rank"] == 0}
    assert all(abs(v) < float("inf") for v in loss.values()), loss  # finite, not NaN
    # measured: 3.47 at step 10 (before the stop); 3.28, 2.95, 2.77 at 20, 30, 40. Four
    # steps after the resume the loss is below the stop's: the resumed model is the
    # checkpoint's (a fresh one is near ln 65 = 4.17 at its 4th step); it keeps falling
    assert loss[20] < loss[10] < 4.0, loss
    assert loss[40] < loss[30] < loss[20], loss


def _converted(step: int, cfg: RunConfig) -> int:
    """Step ``step`` of 2 workers x 16 in 3 x 8's micro-batches (same epoch, same fraction)."""
    n = len(make_job(cfg).train)
    return same_place(step, steps_per_epoch(n // 2, 16), steps_per_epoch(n // 3, 8))[1]


def test_a_strategy_without_a_hook_is_refused_in_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    cfg = RunConfig.from_mapping({"strategy": "hogwild", "model": "mlp", "data": "synthetic"},
                                 source="test")
    (run / "config.json").write_text(json.dumps(cfg.to_json()))
    with pytest.raises(ConfigError, match=r"--strategy hogwild cannot be resized: its "
                                          r"strategy has no resize \(only sync, .*zero"):
        resize_run(run, 2, 32)
    with pytest.raises(ConfigError, match="no config.json"):
        resize_run(tmp_path, 2, 32)
    (run / "config.json").write_text("{nope")
    with pytest.raises(ConfigError, match=r"config.json: not valid JSON"):
        resize_run(run, 2, 32)
