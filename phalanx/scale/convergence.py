"""Time to a target loss (a model, labelled so wherever it is printed): steps to the target as
a function of the global batch, from Pollux's statistical efficiency
(``phalanx.cluster.model.learned.efficiency``: the gradient-noise-scale model), times a
staleness penalty for the asynchronous family, times the predicted step time.

* ``base_steps``: steps to the target at ``init_batch`` with no staleness;
* ``noise_ratio``: var / sqr of the gradient at ``init_batch`` (Pollux's gradient
  statistics; B_noise = noise_ratio x init_batch);
* ``staleness_slope``: extra steps per unit of mean staleness (1 + c tau).
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.cluster.model.learned import efficiency
from phalanx.errors import ConfigError
from phalanx.scale.setting import Prediction


@dataclass(frozen=True, kw_only=True)
class Convergence:
    base_steps: float = 10_000.0
    init_batch: float = 256.0
    noise_ratio: float = 8.0
    staleness_slope: float = 0.05

    def __post_init__(self) -> None:
        if not (self.base_steps > 0 and self.init_batch > 0 and self.noise_ratio >= 0
                and self.staleness_slope >= 0):
            raise ConfigError("convergence model: base steps and initial batch must be > 0, "
                              "noise ratio and staleness slope >= 0")

    def steps(self, global_batch: float, staleness: float = 0.0) -> float:
        """Steps at ``global_batch`` to reach what ``base_steps`` at ``init_batch`` reach."""
        scale = global_batch / self.init_batch
        # progress per step in units of initial-batch steps: efficiency x scale (Pollux)
        gain = float(efficiency(global_batch, self.init_batch, 1.0, self.noise_ratio)) * scale
        return self.base_steps / gain * (1.0 + self.staleness_slope * max(staleness, 0.0))

    def time_to_target(self, p: Prediction) -> float:
        """Seconds to the target. An asynchronous step is one worker's update: N of them
        per cycle, each of that worker's batch."""
        if p.staleness_mean is not None and p.strategy not in ("hogwild",):
            updates = self.steps(p.samples_per_step / p.workers, p.staleness_mean)
            return updates * p.step_s / p.workers
        return self.steps(p.samples_per_step, p.staleness_mean or 0.0) * p.step_s
