"""Deterministic, disjoint sharding of a data set over workers, and the batch order."""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction

import torch

from phalanx.errors import DataError


def shard_indices(
    labels: torch.Tensor, rank: int, world: int, seed: int = 0, non_iid: float = 0.0
) -> torch.Tensor:
    """Indices of worker ``rank``'s shard. Shards are disjoint and together cover the set.

    ``non_iid`` in [0, 1] is the fraction of samples dealt out sorted by label (so each
    worker sees few classes of it); the rest is dealt out uniformly at random.
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} not in 0..{world - 1}")
    n = len(labels)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=g)
    k = int(round(non_iid * n))
    skewed, rest = order[:k], order[k:]
    if k:
        # stable sort by label so the order within a class is still the random one
        skewed = skewed[torch.sort(labels[skewed], stable=True).indices]
    parts = [p[rank] for p in (skewed.tensor_split(world), rest.tensor_split(world))]
    return torch.cat(parts)


def epoch_batches(
    indices: torch.Tensor, batch_size: int, epoch: int, seed: int = 0
) -> Iterator[torch.Tensor]:
    """Shuffled full batches of ``indices`` for one epoch (the last partial batch is dropped
    so every worker takes the same number of steps).

    Fewer samples than one batch is an error, not an empty epoch: a loop "until N steps"
    over empty epochs would never end."""
    if len(indices) < batch_size:
        raise DataError(f"--batch-size: {batch_size} is larger than this worker's "
                        f"{len(indices)} samples; an epoch would have no step")
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = indices[torch.randperm(len(indices), generator=g)]
    for start in range(0, len(perm) - batch_size + 1, batch_size):
        yield perm[start : start + batch_size]


def steps_per_epoch(shard_size: int, batch_size: int) -> int:
    return shard_size // batch_size


def same_place(micro: int | Fraction, per_old: int, per_new: int) -> tuple[int, int]:
    """A position ``micro`` micro-batches into a run of ``per_old`` micro-batches per epoch,
    in a run of ``per_new``: (epoch, micro-batches), the same epoch and the same fraction
    of it (an elastic resize: another worker count or batch re-cuts every epoch)."""
    epoch, done = divmod(micro, per_old)
    return int(epoch), int(epoch * per_new + round(done / per_old * per_new))
