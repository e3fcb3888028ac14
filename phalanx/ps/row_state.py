"""The rows of a sparse table's rule state: a shard updates only the rows a push touched,
with the optimizer state of those rows (a lazy sparse update). The helpers live with the
rules (:mod:`phalanx.rules.sparse`), which single and sync use on a sparse table too."""

from __future__ import annotations

from phalanx.rules.sparse import gather_rows, scatter_rows

__all__ = ["gather_rows", "scatter_rows"]
