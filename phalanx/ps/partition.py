"""Which shard holds which parameters.

Dense parameters are flattened, concatenated in model order and cut into ``S`` contiguous
ranges of equal size, so every shard holds the same number of bytes to within one
element. A tensor may straddle two shards: every update rule in :mod:`phalanx.rules` is
elementwise, so updating the two halves on two servers is exactly updating the whole.

A sparse table (the input embedding of a model whose first layer is ``nn.Embedding`` /
``nn.EmbeddingBag``: the high-dimensional sparse case) is never moved whole: its rows are
dealt out by row id, row ``r`` to shard ``r % S`` (so hot low ids spread over shards),
and workers pull and push only the rows their batch touches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class SparseTable:
    param: int  # index of the table in the model's trainable parameters
    rows: int
    dim: int


@dataclass(frozen=True)
class Partition:
    shards: int
    dense_params: tuple[int, ...]  # indices (into the trainable parameters) of dense ones
    dense_shapes: tuple[tuple[int, ...], ...]
    bounds: tuple[int, ...]  # S + 1 offsets into the flat dense vector
    table: SparseTable | None = None

    @property
    def dense_numel(self) -> int:
        return self.bounds[-1]

    def dense_range(self, shard: int) -> tuple[int, int]:
        return self.bounds[shard], self.bounds[shard + 1]

    def local_rows(self, shard: int) -> int:
        """How many rows of the sparse table shard ``shard`` holds."""
        if self.table is None:
            return 0
        return max(0, (self.table.rows - shard + self.shards - 1) // self.shards)

    def owner(self, rows: torch.Tensor) -> torch.Tensor:
        return rows % self.shards

    def local_index(self, rows: torch.Tensor) -> torch.Tensor:
        """Position of each (global) row id inside its shard's local table."""
        return rows // self.shards

    def split_rows(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """Row ids per shard (each keeps the order of ``rows``)."""
        owner = self.owner(rows)
        return [rows[owner == k] for k in range(self.shards)]

    def shard_bytes(self, shard: int, element_size: int = 4) -> int:
        a, b = self.dense_range(shard)
        dim = self.table.dim if self.table else 0
        return (b - a + self.local_rows(shard) * dim) * element_size


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def find_table(model: nn.Module) -> SparseTable | None:
    """The input embedding of a sequential model, if it has one (else everything is dense)."""
    first = next(iter(model.children()), None)
    if isinstance(model, nn.Sequential) and isinstance(first, (nn.Embedding, nn.EmbeddingBag)):
        params = trainable(model)
        idx = next(i for i, p in enumerate(params) if p is first.weight)
        return SparseTable(idx, first.weight.shape[0], first.weight.shape[1])
    return None


def partition(model: nn.Module, shards: int, sparse: bool = True) -> Partition:
    """Cut ``model``'s trainable parameters over ``shards`` servers (see module doc)."""
    if shards < 1:
        raise ValueError("shards must be >= 1")
    params = trainable(model)
    table = find_table(model) if sparse else None
    dense = tuple(i for i in range(len(params)) if table is None or i != table.param)
    total = sum(params[i].numel() for i in dense)
    bounds = tuple(total * k // shards for k in range(shards + 1))
    shapes = tuple(tuple(params[i].shape) for i in dense)
    return Partition(shards, dense, shapes, bounds, table)


def flat_dense(part: Partition, tensors: list[torch.Tensor]) -> torch.Tensor:
    """The dense tensors (parameters or gradients) as one flat vector, in partition order."""
    if not part.dense_params:
        return torch.zeros(0)
    return torch.cat([tensors[i].detach().reshape(-1) for i in part.dense_params])


def unflatten_into(part: Partition, flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy a flat dense vector back into the model's dense tensors (in place)."""
    offset = 0
    with torch.no_grad():
        for i in part.dense_params:
            n = tensors[i].numel()
            tensors[i].copy_(flat[offset : offset + n].view_as(tensors[i]))
            offset += n
