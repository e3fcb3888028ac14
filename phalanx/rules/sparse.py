"""A rule on a table whose gradient is sparse: only the rows a step touched are updated,
with their own rows of the rule's state (a *lazy* sparse update, as ``torch.optim``'s
``SparseAdam`` and a parameter-server shard do).

For ``sgd`` and ``adagrad`` without weight decay this is the dense update exactly: a row
whose gradient is zero moves by zero and its state stays. For rules with a memory of
earlier steps (momentum, Adam) a dense update keeps moving untouched rows by their
momentum; the lazy one does not (docs/workloads.md).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from phalanx.rules.base import UpdateRule, apply_updates


def gather_rows(state: Any, idx: torch.Tensor, n: int) -> Any:
    """The rows ``idx`` of every per-row tensor in a rule state (scalars pass through)."""
    if isinstance(state, torch.Tensor):
        return state[idx] if state.dim() >= 1 and state.shape[0] == n else state
    if isinstance(state, tuple) and hasattr(state, "_fields"):
        return type(state)(*[gather_rows(s, idx, n) for s in state])
    if isinstance(state, (tuple, list)):
        return type(state)(gather_rows(s, idx, n) for s in state)
    return state


def scatter_rows(full: Any, part: Any, idx: torch.Tensor, n: int) -> Any:
    """``part`` (from :func:`gather_rows`) written back into ``full`` at rows ``idx``."""
    if isinstance(full, torch.Tensor):
        if full.dim() >= 1 and full.shape[0] == n:
            full[idx] = part  # in place: the state is the caller's own
            return full
        return part
    if isinstance(full, tuple) and hasattr(full, "_fields"):
        return type(full)(*[scatter_rows(f, p, idx, n) for f, p in zip(full, part)])
    if isinstance(full, (tuple, list)):
        return type(full)(scatter_rows(f, p, idx, n) for f, p in zip(full, part))
    return part


def sparse_rows(grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row ids, their gradient rows) of a sparse COO gradient, repeated ids summed."""
    g = grad.coalesce()
    return g.indices()[0], g.values()


def update_rows(rule: UpdateRule, state: Any, weight: torch.Tensor, ids: torch.Tensor,
                grad_rows: torch.Tensor, **extra: Any) -> Any:
    """``weight[ids] += rule(grad_rows)`` with the rows ``ids`` of ``state`` (the rule's
    state over the whole ``weight``); returns the state. ``ids``: unique."""
    n = weight.shape[0]
    with torch.no_grad():
        params = weight[ids]
        rows_state = gather_rows(state, ids, n)
        updates, rows_state = rule.update([grad_rows], rows_state, [params], **extra)
        weight[ids] = params + updates[0]
    return scatter_rows(state, rows_state, ids, n)


class TableState(NamedTuple):
    dense: Any  # the rule's state over every parameter but the table
    table: Any  # its state over the table (updated row by row)


class TableRule:
    """``rule`` over a model's parameters, the one at ``table`` updated row by row when
    its gradient is sparse (dense otherwise). The others take the rule as usual."""

    def __init__(self, rule: UpdateRule, table: int) -> None:
        self.rule, self.table = rule, table

    def init(self, params: list[torch.Tensor]) -> TableState:
        others = [p for i, p in enumerate(params) if i != self.table]
        return TableState(self.rule.init(others), self.rule.init([params[self.table]]))

    def step(self, grads: list[torch.Tensor], state: TableState,
             params: list[torch.Tensor]) -> TableState:
        """Apply one step in place; returns the new state."""
        t = self.table
        others = [i for i in range(len(params)) if i != t]
        updates, dense = self.rule.update([grads[i] for i in others], state.dense,
                                          [params[i] for i in others])
        apply_updates([params[i] for i in others], updates)
        g = grads[t]
        if g is None:
            return TableState(dense, state.table)
        if g.is_sparse:
            ids, rows = sparse_rows(g)
            return TableState(dense, update_rows(self.rule, state.table, params[t], ids, rows))
        updates, table = self.rule.update([g], state.table, [params[t]])
        apply_updates([params[t]], updates)
        return TableState(dense, table)


def sparse_table(model: torch.nn.Module, params: list[torch.Tensor]) -> int | None:
    """The index in ``params`` of an embedding table whose gradient is sparse
    (``nn.Embedding`` / ``nn.EmbeddingBag`` with ``sparse=True``), or None."""
    for m in model.modules():
        if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse:
            return next((i for i, p in enumerate(params) if p is m.weight), None)
    return None
