"""What every elastic resize shares (sync / average: :mod:`phalanx.cluster.live.resize`; the
parameter server: :mod:`phalanx.cluster.live.resize_ps`): the stopped run's settings, the
learning rate that follows the worker count, the epochs in the old and new micro-batches,
and config.json rewritten with the new settings."""

from __future__ import annotations

import json
from pathlib import Path

from phalanx.config import RunConfig
from phalanx.data import steps_per_epoch
from phalanx.errors import ConfigError
from phalanx.parallel.registry import spec
from phalanx.rules import RULES


def run_config(run_dir: Path) -> RunConfig:
    values = json.loads((run_dir / "config.json").read_text())
    return RunConfig.from_mapping(values, source=f"{run_dir}/config.json")


def default_lr(old: RunConfig, workers: int) -> float | None:
    """The learning rate of a run resized to ``workers`` whose rule is its strategy's
    default momentum for its worker count (``spec.momentum_for``, recorded resolved in
    config.json): the one a fresh run with ``workers`` gets, kept as momentum at one worker
    (the same effective step as single's SGD: the rule state is momentum's). Anything
    else -- the user's rule or rate, plain SGD of a run started with one worker -- stays."""
    if old.workers > 1 and spec(old.strategy).default_rule(old) == (old.rule, old.lr):
        return round(RULES.get("sgd").default_lr * (1.0 - old.momentum) * workers, 12)
    return old.lr


def micro_per_epoch(run_dir: Path, samples: int, old: RunConfig, workers: int,
                    batch_size: int) -> tuple[int, int]:
    """Micro-batches per epoch of a worker's shard before and after the resize; refuses a
    batch that leaves a shard fewer micro-batches than one step accumulates."""
    per_new = steps_per_epoch(samples // workers, batch_size)
    if per_new < old.grad_accum:
        raise ConfigError(f"{run_dir}: batch {batch_size} x {workers} workers leaves a shard "
                          f"of fewer than {old.grad_accum} micro-batches")
    return steps_per_epoch(samples // old.workers, old.batch_size), per_new


def write_config(run_dir: Path, new: RunConfig, fields: tuple[str, ...]) -> None:
    """config.json with ``fields`` taken from ``new`` (the rest as the run wrote it)."""
    values = json.loads((run_dir / "config.json").read_text())
    values.update({k: getattr(new, k) for k in fields})
    (run_dir / "config.json").write_text(json.dumps(values, indent=2) + "\n")
