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
    ``update(grads, state, params=None, *, staleness=0, backup=None) -> (updates, state)``.

    ``update_`` (optional, same signature): the same arithmetic, bit for bit, done in the
    caller's ``grads`` (and the state's own tensors) instead of new tensors. A caller that
    owns its gradients (a parameter-server shard owns what it received) uses it to skip
    an allocation per step: on a 1M-parameter shard a fresh 4 MB tensor per push cost
    ~600 page faults, more than the arithmetic. Its updates never alias its state.
    """

    init: Callable[[Sequence[torch.Tensor]], Any]
    update: Callable[..., tuple[Tensors, Any]]
    update_: Callable[..., tuple[Tensors, Any]] | None = None


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

    def update_(grads, state: ChainState, params=None, *, staleness: int = 0, backup=None):
        new_states = []
        updates = list(grads)
        for rule, s in zip(rules, state.inner):
            updates, s = rule.update_(updates, s, params, staleness=staleness, backup=backup)
            new_states.append(s)
        return updates, ChainState(tuple(new_states))

    # in place only when every link is: a functional link's output may alias its state
    # (a momentum trace), which the next link must not overwrite
    return UpdateRule(init, update, update_ if all(r.update_ for r in rules) else None)


def apply_updates(params: Sequence[torch.Tensor], updates: Sequence[torch.Tensor]) -> None:
    """``p += u`` in place, without autograd tracking."""
    with torch.no_grad():
        torch._foreach_add_(list(params), list(updates))


def update_owned(rule: UpdateRule, grads: Sequence[torch.Tensor], state: Any,
                 params: Sequence[torch.Tensor] | None = None, *, staleness: int = 0,
                 backup: Sequence[torch.Tensor] | None = None) -> tuple[Tensors, Any]:
    """``rule``'s update of gradients the caller owns and will not read again: in place
    when the rule can (same values, bit for bit), else the functional update."""
    fn = rule.update_ or rule.update
    return fn(grads, state, params, staleness=staleness, backup=backup)


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
