"""No setting is silently ignored (issue #26).

For every strategy and every setting at a value other than its default, the setting
either changes what the run does or is refused in one line naming the flag.

- The fast part is exhaustive and runs in-process: every (strategy, setting) pair goes
  through the checks every entry point runs (``check_config`` + ``check_flags_apply``).
  A refusal must be one line naming the flag. What is accepted must be in
  ``settings_accepted.json``: the pairs the slow sweep below has run and seen change the
  run. A refusal removed from a spec (e.g. ``allreduce`` dropped from sync's and
  average's ``options``) makes ``asp`` accept ``--allreduce``, a pair the table lacks: the
  test fails and says to run the sweep.
- The slow part (``-m slow``) runs every accepted pair for a few steps with real processes
  next to the strategy's baseline and compares what the run did: the final weights, the
  summary's statistics, the events and the files written. A run the setting refuses at
  run time (e.g. ``--device cuda`` here) counts as a refusal. ``ACTS_ONLY_ON`` lists the
  settings that act only on a fault or on the machine, not on a healthy run's results,
  with where they are tested.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import torch

import phalanx
from phalanx.config import RunConfig
from phalanx.errors import PhalanxError
from phalanx.metrics import read_events
from phalanx.parallel.registry import NAMES, STRATEGIES, check_config, check_flags_apply

TABLE = Path(__file__).with_name("settings_accepted.json")

# a value other than the default for every setting, valid on its own
SAMPLE = {
    "model": "logreg", "data": "digits", "data_dir": "/tmp", "train_limit": 384,
    "test_limit": 50, "non_iid": 0.5, "augment": "flip", "epochs": 0.1, "max_steps": 3,
    "batch_size": 32, "lr": 0.02, "rule": "adam", "momentum": 0.5, "weight_decay": 0.01,
    "schedule": "cosine", "warmup_steps": 2, "step_size": 2, "gamma": 0.5, "grad_accum": 2,
    "workers": 3, "seed": 1, "device": "cuda", "threads": 1, "slow_workers": {0: 2.0},
    "backend": "gloo", "data_on_device": "no", "worker_threads": 1, "servers": 2,
    "staleness": 1, "softsync": 2, "nfetch": 2, "npush": 2, "dc_lambda": 0.5,
    "dc_adaptive": True, "dc_momentum": 0.5, "staleness_lr": True, "ps_timeout": 30.0,
    "heartbeat_s": 0.5, "on_worker_loss": "stop", "kill_worker": "1@2", "kill_server": "0@2",
    "drop_messages": 0.3, "pull_ahead": True, "consistency": "ssp",
    "downpour_local_steps": False, "allreduce": "ring", "bucket_mb": 0.001, "sfb": True,
    "period": 2, "average_optimizer_state": True, "compress": "int8", "error_feedback": False,
    "outer_rule": "nesterov", "outer_lr": 0.5, "outer_momentum": 0.5, "stages": 3,
    "microbatches": 2, "pipeline_schedule": "1f1b", "replicas": 2, "split_layer": "1",
    "lock": True, "portions": 8, "history": 5, "line_search": "none", "static_portions": True,
    "out": "elsewhere", "eval_every": 2, "checkpoint_every": 2, "resume": "/nonexistent",
    "progress": False, "tensorboard": False, "overwrite": True,
    "tokens": "byte", "context": 16, "gpt_layers": 2, "gpt_heads": 2, "gpt_dim": 32,
    "dropout": 0.1, "clip_grad_norm": 0.5,
    "ctr_rows": 1000, "ctr_dim": 8, "sparse_allreduce": True, "transport": "gloo",
    "zero_stage": 3, "activation_checkpoint": 1, "precision": "bf16",
    "memory_limit": 8 << 30, "split_at": "blocks",
}
FIELDS = [f.name for f in dataclasses.fields(RunConfig) if f.name != "strategy"]

# accepted settings that act only on a fault, on the machine or on the output folder, not
# on a healthy run's results: where each one is tested instead
ACTS_ONLY_ON = {
    "ps_timeout": "a silent peer (tests/distributed/test_ps_faults.py)",
    "heartbeat_s": "a silent peer (tests/distributed/test_ps_faults.py)",
    "on_worker_loss": "a dead worker (tests/distributed/test_ps_faults.py)",
    "slow_workers": "timing only (tests/distributed/test_stragglers*.py)",
    "threads": "the machine's threads (tests/unit/test_placement.py)",
    "worker_threads": "the machine's threads (tests/unit/test_placement.py)",
    "backend": "the transport; gloo is what auto picks on a CPU host",
    "transport": "the road a message takes, not what it carries (tests/distributed/"
                 "test_ps_shm.py: the same counters and weights over shm and gloo)",
    "data_on_device": "a GPU (tests/gpu)",
    "progress": "the terminal (tests/unit/test_progress.py)",
    "out": "where the run folder is",
    "activation_checkpoint": "memory only, the same numbers (tests/unit/test_recompute.py; "
                             "tests/distributed/test_zero.py: zero-3 with it, bit for bit)",
    "overwrite": "an earlier run in --out (tests/e2e)",
    "memory_limit": "an allocation past it (tests/distributed/test_memory_limit.py)",
}


def base_config(name: str) -> dict:
    s = STRATEGIES[name]
    base = {"strategy": name, "model": "mlp", "data": "synthetic", "max_steps": 4,
            "batch_size": 16, "train_limit": 256, "test_limit": 64, "progress": False,
            "tensorboard": True, "eval_every": 0}
    if "workers" not in s.unused:
        base["workers"] = s.fixed_workers or 2
    base = {k: v for k, v in base.items() if k not in s.unused}
    base.update(s.example)
    if s.full_batch:
        base["max_steps"] = 3
    return base


def verdict(name: str, setting: str) -> str | None:
    """None: accepted; else the one-line refusal."""
    values = {**base_config(name), setting: SAMPLE[setting]}
    try:
        cfg = RunConfig.from_mapping(values)
        check_config(cfg)
        check_flags_apply(cfg)
    except PhalanxError as e:
        return str(e)
    return None


def accepted_pairs() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name in NAMES:
        for setting in FIELDS:
            if verdict(name, setting) is None:
                out.setdefault(setting, []).append(name)
    return out


def test_samples_cover_every_setting() -> None:
    assert sorted(SAMPLE) == sorted(FIELDS)
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    for setting, value in SAMPLE.items():
        assert value != defaults[setting], setting


def test_every_refusal_is_one_line_naming_the_flag() -> None:
    for name in NAMES:
        for setting in FIELDS:
            why = verdict(name, setting)
            if why is not None:
                flag = "--" + setting.replace("_", "-")
                assert "\n" not in why and flag in why, (name, setting, why)


def test_what_is_accepted_was_seen_to_change_the_run() -> None:
    table = json.loads(TABLE.read_text())
    now = accepted_pairs()
    new = sorted((s, n) for s, names in now.items() for n in names
                 if n not in table.get(s, []))
    assert not new, (f"accepted but never shown to change the run: {new}; refuse them "
                     "(spec options / unused / needs) or run `pytest -m slow "
                     f"{Path(__file__).name}` and add them to {TABLE.name}")
    gone = sorted((s, n) for s, names in table.items() for n in names
                  if n not in now.get(s, []))
    assert not gone, f"now refused: {gone}; drop them from {TABLE.name}"


# ---- the slow sweep: every accepted pair, run ----------------------------------------

def fingerprint(out: Path, result) -> dict:
    params = torch.cat([p.detach().reshape(-1).double() for p in result.model.parameters()])
    # times and memory vary from run to run whatever the settings: left out
    summary = {k: v for k, v in result.summary.items()
               if not (k.endswith("_s") or k.endswith("per_s") or k in ("launch_wall_s",)
                       or k.startswith(("peak_rss", "max_memory")))}
    kinds: dict[str, int] = {}  # (a "memory" event per process, in every run alike)
    for e in read_events(out / "events.jsonl"):
        kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1
    files = sorted(str(p.relative_to(out)).split("/")[0] for p in out.rglob("*") if p.is_file())
    return {"params": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
            "summary": json.dumps(summary, sort_keys=True, default=str), "events": kinds,
            "files": sorted(set(files))}


def run(values: dict, out: Path):
    try:
        result = phalanx.train(**{**values, "out": str(out)})
    except (PhalanxError, SystemExit) as e:
        return f"refused: {e}"
    return fingerprint(out, result)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_each_accepted_setting_changes_the_run(tmp_path: Path, name: str) -> None:
    table = json.loads(TABLE.read_text())
    base = base_config(name)
    baseline = run(base, tmp_path / "base")
    assert isinstance(baseline, dict), baseline
    silent = []
    for setting, names in table.items():
        if name not in names or setting in ACTS_ONLY_ON or setting == "out":
            continue
        changed = run({**base, setting: SAMPLE[setting]}, tmp_path / setting)
        if changed == baseline:
            silent.append(setting)
    assert not silent, f"--strategy {name} accepts but ignores {silent}"
