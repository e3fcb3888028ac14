"""The elastic round's cadence (``--interval``, ``--restart-cost``, ``--restart-first``):
one section, checked here once, shared by the interval engine and the live elastic engine."""

from __future__ import annotations

import math
from dataclasses import dataclass

from phalanx.errors import ConfigError

# a scheduler decides every few seconds at the fastest; a smaller step only multiplies the
# rounds (a 1e-9 s interval never ended)
MIN_INTERVAL_S = 1.0


@dataclass(frozen=True)
class Cadence:
    """How often the round runs and what a change of allocation costs."""

    interval_s: float = 60.0
    restart_cost_s: float = 30.0
    restart_first: bool = True     # the first start pays the restart cost too

    def __post_init__(self) -> None:
        if not MIN_INTERVAL_S <= self.interval_s < math.inf:
            raise ConfigError(f"--interval must be a finite number >= {MIN_INTERVAL_S:g} seconds, "
                              f"got {self.interval_s}")
        if not 0 <= self.restart_cost_s < math.inf:
            raise ConfigError(f"--restart-cost must be a finite number >= 0 seconds, "
                              f"got {self.restart_cost_s}")
