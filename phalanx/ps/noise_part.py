"""A shard's part of the gradient-noise estimate of a BSP run (McCandlish et al. 2018's
two-batch estimator, :mod:`phalanx.metrics.noise`).

Under BSP every update averages the N workers' pushes of one iteration, all computed on
the same weights (the barrier): a push is a gradient over B_small = batch x accumulation
samples, their mean one over N x B_small -- the two batch sizes of sync's estimator, at
the same point. A shard holds a slice of the parameters, and both squared norms are sums
over slices, so each shard logs its slice's share (``noise_part`` events) and the reader
adds the shards' shares of one update (:class:`phalanx.cluster.observe.JobObserver`).

Only BSP: the other models average pushes computed on different weights (or none), and
their efficiency is not a large batch's (docs/cluster.md, "Elastic resize").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

EVERY = 10   # updates between two shares (the cost: one squared norm per push then)


def shares(pushes: Sequence[torch.Tensor], mean: torch.Tensor) -> tuple[float, float]:
    """(mean of the pushes' squared norms, the squared norm of their mean) on this slice."""
    small = sum(float(g.double().pow(2).sum()) for g in pushes) / len(pushes)
    return small, float(mean.double().pow(2).sum())
