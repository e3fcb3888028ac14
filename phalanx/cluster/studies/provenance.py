"""What a study's row records of how it was made: the commit of the code that ran and the
options after presets and defaults were resolved, so a figure in the docs can be traced to
the run that made it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

from phalanx.cluster.sim.run import SimulateOptions

# fields that say where a run read its data or how it printed, not what it ran
NOT_OPTIONS = ("data_dir", "progress")


def commit() -> str:
    """The checkout's commit (short), ``+dirty`` when tracked files under ``phalanx/``
    differ from it; ``unknown`` outside a git checkout."""
    here = Path(__file__).parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=False, cwd=here).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                str(here.parents[1])], capture_output=True, text=True,
                               check=False, cwd=here).stdout.strip()
    except OSError:
        return "unknown"
    return (head + ("+dirty" if dirty else "")) if head else "unknown"


def resolved(opts: SimulateOptions) -> str:
    """The options as run, every section's fields included (compact JSON, keys sorted)."""
    given = {k: v for k, v in dataclasses.asdict(opts).items() if k not in NOT_OPTIONS}
    return json.dumps(given, sort_keys=True, separators=(",", ":"))
