"""What every strategy's elastic resize shares (``StrategySpec.resize``: sync / average in
:mod:`phalanx.parallel.dp_resize`, the parameter server in :mod:`phalanx.parallel.ps_resize`,
zero in :mod:`phalanx.parallel.zero_resize`): the epochs in the old and new micro-batches,
and config.json rewritten with the new settings."""

from __future__ import annotations

import json
from pathlib import Path

from phalanx.config import RunConfig
from phalanx.data import steps_per_epoch
from phalanx.errors import ConfigError


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
