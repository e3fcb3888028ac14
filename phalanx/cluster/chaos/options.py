"""``phalanx chaos``'s options, each checked once (a one-line :class:`ConfigError`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from phalanx.cluster.chaos.disk import can_mount
from phalanx.cluster.chaos.faults import ENGINE_KINDS, FAULT_KINDS
from phalanx.errors import ConfigError

MAX_SEED = 2**32 - 1


ENGINES = tuple(ENGINE_KINDS)


def default_kinds(engine: str = "local") -> tuple[str, ...]:
    """Every kind this machine can inject on ``engine`` (the full disk needs root to mount
    a tmpfs)."""
    return tuple(k for k in ENGINE_KINDS[engine] if k != "disk-full" or can_mount())


def parse_kinds(text: str, engine: str = "local") -> tuple[str, ...]:
    """``all`` or a comma list of ``engine``'s kinds (:data:`ENGINE_KINDS`)."""
    if engine not in ENGINE_KINDS:
        raise ConfigError(f"--engine {engine}: not an engine (one of {', '.join(ENGINES)})")
    if text.strip() == "all":
        return default_kinds(engine)
    kinds = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if not kinds or unknown:
        raise ConfigError(f"--kinds: {', '.join(unknown) or 'empty'}: not a fault kind (all, "
                          f"or a comma list of {', '.join(FAULT_KINDS)})")
    other = [k for k in kinds if k not in ENGINE_KINDS[engine]]
    if other:
        raise ConfigError(f"--kinds {', '.join(other)}: not a fault of --engine {engine} "
                          f"(its kinds: {', '.join(ENGINE_KINDS[engine])})")
    if "disk-full" in kinds and not can_mount():
        raise ConfigError("--kinds disk-full: mounting its tmpfs needs root and mount(8); "
                          "drop it from --kinds")
    return kinds


@dataclass(frozen=True, kw_only=True)
class ChaosOptions:
    out: Path
    seed: int = 0
    runs: int = 1
    faults: int = 12
    jobs: int = 24
    kinds: tuple[str, ...] = FAULT_KINDS[:6]
    engine: str = "local"           # 'local' (this machine's slots) or 'ray' (test hosts)
    window_s: float = 0.0           # faults fall in [1, window] s; 0: from the job count
    timeout_s: float = 600.0        # a run whose schedule has not ended by then fails

    def __post_init__(self) -> None:
        checks = (("--seed", self.seed, 0, MAX_SEED), ("--runs", self.runs, 1, 1000),
                  ("--faults", self.faults, 0, 1000), ("--jobs", self.jobs, 1, 200))
        for flag, value, lo, hi in checks:
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise ConfigError(f"{flag} must be an integer in [{lo}, {hi}], got {value!r}")
        if self.seed + self.runs - 1 > MAX_SEED:
            raise ConfigError(f"--seed {self.seed} + --runs {self.runs}: seeds past {MAX_SEED}")
        if not (math.isfinite(self.window_s) and 0 <= self.window_s <= 3600):
            raise ConfigError(f"--window must be in [0, 3600] seconds, got {self.window_s}")
        if not (math.isfinite(self.timeout_s) and 10 <= self.timeout_s <= 86400):
            raise ConfigError(f"--timeout must be in [10, 86400] seconds, got {self.timeout_s}")
        if self.engine not in ENGINE_KINDS:
            raise ConfigError(f"--engine {self.engine}: not an engine (one of "
                              f"{', '.join(ENGINES)})")
        bad = [k for k in self.kinds if k not in ENGINE_KINDS[self.engine]]
        if not self.kinds or bad:
            raise ConfigError(f"--kinds: {', '.join(bad) or 'empty'}: not a fault kind of "
                              f"--engine {self.engine}")
        out = Path(self.out)
        if out.exists() and not out.is_dir():
            raise ConfigError(f"--out {out}: a file, not a folder")
        if str(out.resolve()).startswith(("/proc", "/sys", "/dev")):
            raise ConfigError(f"--out {out}: not a place for a run's files")

    def window(self, jobs: int) -> float:
        """Where the faults fall: [1, window] s after the schedule starts."""
        # on Ray a host fault holds the next one (and a kill of the scheduler) until its
        # node is back: seconds each, so the faults are spread wider
        return self.window_s or 4.0 + (1.6 if self.engine == "local" else 5.0) * jobs
