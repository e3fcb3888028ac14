"""Update rules as ``init/update`` pairs, composable with :func:`chain` (as in optax).

A rule turns gradients into *updates* that are added to the parameters
(``p += u``). Extra inputs that only some rules need are keyword-only, so a rule that
needs them fails loudly when they are missing:

* ``staleness`` (int): how many server updates happened since the gradient's weights were
  pulled (parameter server);
* ``backup`` (list of tensors): the weights the worker computed its gradient on
  (DC-ASGD keeps one such backup per worker).

Rules are plain tensor code, so the same rule runs on a worker (sync data parallel) and
on a parameter-server shard.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

Tensors = list[torch.Tensor]


class UpdateRule(NamedTuple):
    """``init(params) -> state``;
    ``update(grads, state, params=None, *, staleness=0, backup=None) -> (updates, state)``."""

    init: Callable[[Sequence[torch.Tensor]], Any]
    update: Callable[..., tuple[Tensors, Any]]


class EmptyState(NamedTuple):
    pass


class ChainState(NamedTuple):
    inner: tuple


def chain(*rules: UpdateRule) -> UpdateRule:
    """Apply rules in order; each one transforms the previous one's updates."""

    def init(params: Sequence[torch.Tensor]) -> ChainState:
        return ChainState(tuple(r.init(params) for r in rules))

    def update(grads, state: ChainState, params=None, *, staleness: int = 0, backup=None):
        new_states = []
        updates = list(grads)
        for rule, s in zip(rules, state.inner):
            updates, s = rule.update(updates, s, params, staleness=staleness, backup=backup)
            new_states.append(s)
        return updates, ChainState(tuple(new_states))

    return UpdateRule(init, update)


def apply_updates(params: Sequence[torch.Tensor], updates: Sequence[torch.Tensor]) -> None:
    """``p += u`` in place, without autograd tracking."""
    with torch.no_grad():
        torch._foreach_add_(list(params), list(updates))


def state_tensors(state: Any) -> list[torch.Tensor]:
    """Every tensor inside a (nested NamedTuple / tuple / list) rule state, in order.

    Used to average optimizer state across workers and to checkpoint it.
    """
    out: list[torch.Tensor] = []
    if isinstance(state, torch.Tensor):
        out.append(state)
    elif isinstance(state, (tuple, list)):
        for item in state:
            out.extend(state_tensors(item))
    return out
