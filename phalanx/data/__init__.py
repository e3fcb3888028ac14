"""Data sets, worker sharding and augmentation."""

from phalanx.data.augment import compose, flip, noise, parse_augment, rotate, translate
from phalanx.data.datasets import DATASETS, DataOptions, Dataset, load_data
from phalanx.data.sharding import epoch_batches, same_place, shard_indices, steps_per_epoch

__all__ = [
    "DATASETS", "DataOptions", "Dataset", "load_data", "shard_indices", "epoch_batches",
    "steps_per_epoch",
    "same_place",
    "compose", "flip", "noise", "rotate", "translate", "parse_augment",
]
