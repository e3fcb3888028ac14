"""``--resume DIR``: restart a crashed run from its own directory.

The restarted run takes every setting from ``DIR/config.json`` (the flags given with
``--resume`` are not merged in, so the run is the same run), except that injected faults
(``--kill-worker``, ``--kill-server``) are not repeated, and that a strategy whose
checkpoints re-shard (``StrategySpec.reshards``: zero) takes ``--workers N`` given with
``--resume`` (other than the default 1): it continues on N workers. The strategy checks its
checkpoints before any process starts (``check_resume(cfg)``; for the parameter server:
every shard's checkpoint exists, passes its checksum and belongs to this run), so a
missing or corrupt checkpoint is one line and exit 2, and nothing in DIR is touched.
"""

from __future__ import annotations

import json
from pathlib import Path

from phalanx.config import RunConfig, read_config_text
from phalanx.errors import ConfigError
from phalanx.parallel.registry import NAMES, STRATEGIES, check_config, spec

WORKERS_DEFAULT = RunConfig.__dataclass_fields__["workers"].default


def resume_config(cfg: RunConfig) -> RunConfig:
    """The configuration of the run in ``cfg.resume``, ready to resume (validated)."""
    resumed = saved_config(cfg)
    strategy = spec(resumed.strategy)
    if strategy.check_resume is None:
        able = [n for n in NAMES if spec(n).can_resume]
        raise ConfigError(f"--resume: --strategy {resumed.strategy} cannot resume a run "
                          f"(only {', '.join(able)} can)")
    strategy.check_resume(resumed)
    return resumed


def saved_config(cfg: RunConfig) -> RunConfig:
    """The settings the run in ``cfg.resume`` was started with (its ``config.json``,
    checked as settings), pointed at its folder; its checkpoints not yet looked at."""
    run_dir = Path(cfg.resume)
    if not run_dir.is_dir():
        raise ConfigError(f"--resume: {run_dir}: no such directory")
    if (run_dir / "summary.json").is_file():  # written only when a run finishes
        raise ConfigError(f"--resume: {run_dir}: the run already finished (summary.json); "
                          "nothing to resume, nothing changed")
    path = run_dir / "config.json"
    if not path.is_file():
        raise ConfigError(f"--resume: {run_dir} has no config.json (not a phalanx run directory)")
    try:
        values = json.loads(read_config_text(path, "--resume"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        raise ConfigError(f"--resume: {path}: not valid JSON ({type(e).__name__})") from None
    if not isinstance(values, dict):
        raise ConfigError(f"--resume: {path}: not a mapping of setting -> value")
    values.update(resume=str(run_dir), out=str(run_dir), kill_worker="", kill_server="",
                  overwrite=False)
    saved = STRATEGIES.get(values.get("strategy"))
    if saved is not None and saved.reshards and cfg.workers != WORKERS_DEFAULT:
        values["workers"] = cfg.workers  # its checkpoint is re-cut for them on load
    return check_config(RunConfig.from_mapping(values, source=f"--resume {path}"))
