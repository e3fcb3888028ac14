"""The rows of a sparse table's rule state: a shard updates only the rows a push touched,
with the optimizer state of those rows (a lazy sparse update)."""

from __future__ import annotations

from typing import Any

import torch


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
            full[idx] = part  # in place: the state is the shard's own
            return full
        return part
    if isinstance(full, tuple) and hasattr(full, "_fields"):
        return type(full)(*[scatter_rows(f, p, idx, n) for f, p in zip(full, part)])
    if isinstance(full, (tuple, list)):
        return type(full)(scatter_rows(f, p, idx, n) for f, p in zip(full, part))
    return part
