"""Resize a stopped run for another worker count and per-worker batch, by its strategy's
own hook (``StrategySpec.resize``), beside ``--resume`` which then continues it: the live
scheduler's elastic resize (``phalanx schedule --policy goodput|sia|pollux``).

The steps every strategy shares are here, once: the run's settings from its
``config.json``, the refusal of a strategy without a hook (or of a run its hook refuses),
the new settings (workers, batch, the learning rate a fresh run of them gets on the
strategy's default rule, then the strategy's own: SoftSync's group, a step budget),
checked as any run's, and only then the strategy's rewrite of its checkpoint: nothing is
written when anything refuses. Which strategies resize and how:
``parallel/dp_resize.py`` (sync, average), ``parallel/ps_resize.py`` (the parameter
server), ``parallel/zero_resize.py`` (zero).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from phalanx.config import RunConfig
from phalanx.entry.api import make_job
from phalanx.errors import ConfigError
from phalanx.parallel.registry import NAMES, check_config, spec


def run_config(run_dir: Path) -> RunConfig:
    """The settings the run in ``run_dir`` was started with (its config.json)."""
    path = run_dir / "config.json"
    if not path.is_file():
        raise ConfigError(f"{run_dir}: no config.json (not a phalanx run directory): cannot "
                          "resize")
    try:
        values = json.loads(path.read_text())
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise ConfigError(f"{path}: not valid JSON ({type(e).__name__}): cannot resize") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: not a mapping of setting -> value: cannot resize")
    return RunConfig.from_mapping(values, source=str(path))


def refusal(cfg: RunConfig) -> str:
    """Why a run with these settings cannot be resized ('' when it can)."""
    resize = spec(cfg.strategy).resize
    if resize is None:
        able = [n for n in NAMES if spec(n).resize is not None]
        return f"its strategy has no resize (only {', '.join(able)} have)"
    return resize.refusal(cfg)


def default_lr(old: RunConfig, workers: int) -> float | None:
    """The learning rate of ``old`` resized to ``workers`` (``StrategySpec.resized_lr``)."""
    return spec(old.strategy).resized_lr(old, workers)


def resized_settings(old: RunConfig, workers: int, batch_size: int) -> RunConfig:
    """The run's settings for ``workers`` x ``batch_size``, checked."""
    s = spec(old.strategy)
    if s.resize is None:
        raise ConfigError(f"--strategy {old.strategy} cannot be resized: {refusal(old)}")
    new = dataclasses.replace(old, workers=workers, batch_size=batch_size, resume="",
                              lr=default_lr(old, workers))
    return check_config(s.resize.settings(old, new))


def resize_run(run_dir: Path, workers: int, batch_size: int) -> tuple[int, int]:
    """Rewrite the stopped run in ``run_dir`` (its checkpoint and config.json) for
    ``workers`` x ``batch_size``, so that ``--resume run_dir`` continues it so; returns
    (the step it stopped at, the step it resumes at). Raises ``ConfigError`` with the
    reason, and writes nothing, when it cannot be resized."""
    old = run_config(run_dir)
    why = refusal(old)
    if why:
        raise ConfigError(f"{run_dir}: --strategy {old.strategy} cannot be resized: {why}")
    old.out = old.resume = str(run_dir)
    new = resized_settings(old, workers, batch_size)
    return spec(old.strategy).resize.rewrite(make_job(old), new)
