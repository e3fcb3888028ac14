"""The live loop's settings, apart from the loop so that what the loop is built from (its
restart, :mod:`restart`) can read them without importing the loop."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from phalanx.errors import ConfigError


@dataclass(frozen=True)
class LiveConfig:
    """The live loop's settings (output folder, poll period, job timeout, grace before
    SIGKILL), checked once."""

    out: Path
    poll_s: float = 0.05            # how often exits and arrivals are checked
    job_timeout_s: float = 0.0      # stop a job running longer than this (0 = never)
    grace_s: float = 30.0           # SIGTERM -> SIGKILL: time to write a checkpoint
    python: str = sys.executable
    max_job_restarts: int = 1       # a failed job starts again this many times, then fails
    lost_wait_s: float = 600.0      # jobs that only lost servers could hold wait this long

    def __post_init__(self) -> None:
        if not 0 < self.poll_s <= 5:
            raise ConfigError(f"--poll must be in (0, 5] seconds, got {self.poll_s}")
        if not 0 <= self.job_timeout_s < float("inf"):
            raise ConfigError(f"--job-timeout must be a finite number >= 0, "
                              f"got {self.job_timeout_s}")
        if not 0 < self.grace_s <= 3600:
            raise ConfigError(f"--grace must be in (0, 3600] seconds, got {self.grace_s}")
        if not 0 <= self.max_job_restarts <= 1000:
            raise ConfigError(f"--max-job-restarts must be in [0, 1000], "
                              f"got {self.max_job_restarts}")
        if not 0 <= self.lost_wait_s <= 7 * 86400:
            raise ConfigError(f"--lost-wait must be in [0, 604800] seconds, "
                              f"got {self.lost_wait_s}")
