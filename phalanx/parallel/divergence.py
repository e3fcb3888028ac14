"""Training that diverged (a NaN or infinite loss) stops with one line naming the likely
cause, instead of finishing with exit 0 and a NaN summary."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from phalanx.config import RunConfig
from phalanx.errors import PhalanxError


class Diverged(PhalanxError):
    """The loss or the parameters stopped being finite numbers."""


def diverged(cfg: RunConfig, what: str) -> Diverged:
    return Diverged(f"training diverged: {what}; the learning rate (--lr {cfg.lr:g} with "
                    f"--rule {cfg.rule}) is probably too high for this model and batch "
                    f"size; try a smaller --lr")


def check_loss(cfg: RunConfig, loss: float, step: int) -> None:
    """Call where the loss is already on the host (a logging point: no extra sync)."""
    if not math.isfinite(loss):
        raise diverged(cfg, f"the training loss is {loss} at step {step}")


def check_parameters(cfg: RunConfig, params: Iterable[torch.Tensor]) -> None:
    for p in params:
        if not torch.isfinite(p).all():
            raise diverged(cfg, "the trained parameters hold NaN or infinite values")
