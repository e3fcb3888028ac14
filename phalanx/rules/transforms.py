"""Small update rules. Formulas follow ``torch.optim`` so each one can be checked against it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from phalanx.rules.base import EmptyState, Tensors, UpdateRule

Schedule = Callable[[int], float]


class CountState(NamedTuple):
    count: torch.Tensor  # int64 scalar: steps taken


class TraceState(NamedTuple):
    trace: Tensors


class AdagradState(NamedTuple):
    sum_sq: Tensors


class RmsState(NamedTuple):
    mean_sq: Tensors


class AdamState(NamedTuple):
    count: torch.Tensor
    mu: Tensors
    nu: Tensors


def _zeros(params) -> Tensors:
    return [torch.zeros_like(p) for p in params]


def _mul(tensors: Tensors, factor: float) -> Tensors:
    """``[factor * t for t in tensors]`` in one foreach call: the same products, bit for
    bit, with one kernel launch per list instead of one per tensor (what bounds a small
    model's step on a GPU)."""
    return list(torch._foreach_mul(list(tensors), factor)) if len(tensors) else []


def _mul_(tensors: Tensors, factor: float) -> Tensors:
    """:func:`_mul` into ``tensors`` themselves (the same products)."""
    if len(tensors):
        torch._foreach_mul_(list(tensors), factor)
    return list(tensors)


def _add(a: Tensors, b: Tensors) -> Tensors:
    """``[x + y for x, y in zip(a, b)]`` in one foreach call."""
    return list(torch._foreach_add(list(a), list(b))) if len(a) else []


def scale(step_size: float) -> UpdateRule:
    """``u = step_size * u`` (use a negative step size to descend)."""

    def init(params):
        return EmptyState()

    def update(updates, state, params=None, *, staleness=0, backup=None):
        return _mul(updates, step_size), state

    def update_(updates, state, params=None, *, staleness=0, backup=None):
        return _mul_(updates, step_size), state

    return UpdateRule(init, update, update_)


def scale_by_schedule(schedule: Schedule, sign: float = -1.0) -> UpdateRule:
    """``u = sign * schedule(step) * u``: the learning rate, constant or scheduled."""

    def init(params):
        return CountState(torch.zeros((), dtype=torch.int64))

    def update(updates, state, params=None, *, staleness=0, backup=None):
        lr = sign * schedule(int(state.count))
        return _mul(updates, lr), CountState(state.count + 1)

    def update_(updates, state, params=None, *, staleness=0, backup=None):
        lr = sign * schedule(int(state.count))
        return _mul_(updates, lr), CountState(state.count + 1)

    return UpdateRule(init, update, update_)


def add_decayed_weights(weight_decay: float) -> UpdateRule:
    """``u = u + wd * p`` (coupled L2 weight decay, as ``torch.optim.SGD``; after Adam's
    scaling it is AdamW's decoupled decay)."""

    def init(params):
        return EmptyState()

    def update(updates, state, params=None, *, staleness=0, backup=None):
        if params is None:
            raise ValueError("add_decayed_weights needs params")
        return [u + weight_decay * p for u, p in zip(updates, params)], state

    def update_(updates, state, params=None, *, staleness=0, backup=None):
        if params is None:
            raise ValueError("add_decayed_weights needs params")
        if len(updates):  # the same two roundings: wd * p, then u + that
            torch._foreach_add_(list(updates), torch._foreach_mul(list(params), weight_decay))
        return list(updates), state

    return UpdateRule(init, update, update_)


def clip_by_global_norm(max_norm: float) -> UpdateRule:
    """``u = u * min(1, max_norm / (||u|| + 1e-6))``, the norm over every tensor the rule
    sees (``torch.nn.utils.clip_grad_norm_``'s formula)."""

    def init(params):
        return EmptyState()

    def update(updates, state, params=None, *, staleness=0, backup=None):
        if not len(updates):
            return list(updates), state
        norms = torch._foreach_norm(list(updates))
        total = torch.linalg.vector_norm(torch.stack([n.to(norms[0].dtype) for n in norms]))
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        return [u * coef.to(u.dtype) for u in updates], state

    return UpdateRule(init, update)


def trace(decay: float, nesterov: bool = False) -> UpdateRule:
    """Momentum buffer ``b = decay * b + u`` (torch's SGD with dampening 0).

    With a constant learning rate this is the seeds' ``v = mu*v - lr*g; w = w + v``
    (``v = -lr * b``).
    """

    def init(params):
        return TraceState(_zeros(params))

    def update(updates, state, params=None, *, staleness=0, backup=None):
        new = _add(_mul(state.trace, decay), updates)  # decay * b + u
        out = [u + decay * b for u, b in zip(updates, new)] if nesterov else new
        return out, TraceState(new)

    def update_(updates, state, params=None, *, staleness=0, backup=None):
        # the buffers are the state's own: b *= decay; b += u (the same two roundings);
        # the update is a copy of b, written into u, so it never aliases the state
        if len(updates):
            torch._foreach_mul_(list(state.trace), decay)
            torch._foreach_add_(list(state.trace), list(updates))
            torch._foreach_copy_(list(updates), list(state.trace))
        return list(updates), TraceState(list(state.trace))

    # nesterov's extra term needs a product of its own: it stays functional
    return UpdateRule(init, update, None if nesterov else update_)


def scale_by_adagrad(eps: float = 1e-10, initial: float = 0.0) -> UpdateRule:
    def init(params):
        return AdagradState([torch.full_like(p, initial) for p in params])

    def update(updates, state, params=None, *, staleness=0, backup=None):
        sums = [s + u * u for s, u in zip(state.sum_sq, updates)]
        return [u / (s.sqrt() + eps) for u, s in zip(updates, sums)], AdagradState(sums)

    return UpdateRule(init, update)


def scale_by_rms(alpha: float = 0.99, eps: float = 1e-8) -> UpdateRule:
    def init(params):
        return RmsState(_zeros(params))

    def update(updates, state, params=None, *, staleness=0, backup=None):
        ms = [alpha * m + (1 - alpha) * u * u for m, u in zip(state.mean_sq, updates)]
        return [u / (m.sqrt() + eps) for u, m in zip(updates, ms)], RmsState(ms)

    return UpdateRule(init, update)


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> UpdateRule:
    """``m = b1 m + (1 - b1) u``, ``v = b2 v + (1 - b2) u u``, ``u = (m / bc1) / (sqrt(v) /
    sqrt(bc2) + eps)`` (torch.optim.Adam's formula). Foreach calls, one kernel per list; the
    in-place form runs the same operations in the caller's gradients and the state's own
    buffers: no new tensor per parameter per step (measured on the GPT: the functional
    form's allocations cost 5% of a single-worker step, bench/gpt.py)."""

    def init(params):
        return AdamState(torch.zeros((), dtype=torch.int64), _zeros(params), _zeros(params))

    def moments(updates, mu, nu):  # mu, nu updated in place: b1 m + (1 - b1) u, ...
        torch._foreach_mul_(mu, b1)
        torch._foreach_add_(mu, torch._foreach_mul(updates, 1 - b1))
        sq = torch._foreach_mul(updates, 1 - b2)
        torch._foreach_mul_(sq, updates)
        torch._foreach_mul_(nu, b2)
        torch._foreach_add_(nu, sq)

    def direction(out, mu, nu, t):  # out = (m / bc1) / (sqrt(v) / sqrt(bc2) + eps)
        bc1, bc2 = 1 - b1**t, 1 - b2**t
        denom = torch._foreach_sqrt(nu)
        torch._foreach_div_(denom, math.sqrt(bc2))
        torch._foreach_add_(denom, eps)
        torch._foreach_copy_(out, mu)
        torch._foreach_div_(out, bc1)
        torch._foreach_div_(out, denom)
        return out

    def update(updates, state, params=None, *, staleness=0, backup=None):
        count = state.count + 1
        updates = list(updates)
        if not updates:
            return [], AdamState(count, [], [])
        mu = [m.clone() for m in state.mu]
        nu = [v.clone() for v in state.nu]
        moments(updates, mu, nu)
        out = direction([torch.empty_like(m) for m in mu], mu, nu, int(count))
        return out, AdamState(count, mu, nu)

    def update_(updates, state, params=None, *, staleness=0, backup=None):
        count = state.count + 1
        updates = list(updates)
        if updates:
            mu, nu = list(state.mu), list(state.nu)
            moments(updates, mu, nu)
            direction(updates, mu, nu, int(count))
        return updates, AdamState(count, list(state.mu), list(state.nu))

    return UpdateRule(init, update, update_)


def staleness_scaled() -> UpdateRule:
    """Divide the step by the gradient's staleness (staleness-aware async SGD, Zhang et al.
    2016); a fresh gradient (staleness 0 or 1) is applied unchanged."""

    def init(params):
        return EmptyState()

    def update(updates, state, params=None, *, staleness=0, backup=None):
        if staleness is None:
            raise ValueError("staleness_scaled needs staleness=")
        factor = 1.0 / max(int(staleness), 1)
        return [factor * u for u in updates], state

    def update_(updates, state, params=None, *, staleness=0, backup=None):
        if staleness is None:
            raise ValueError("staleness_scaled needs staleness=")
        return _mul_(updates, 1.0 / max(int(staleness), 1)), state

    return UpdateRule(init, update, update_)


class DcState(NamedTuple):
    mean_sq: Tensors
    count: torch.Tensor  # int64 scalar: updates seen (for the bias correction of mean_sq)


def dc_asgd(lam: float, adaptive: bool = False, momentum: float = 0.95,
            eps: float = 1e-7) -> UpdateRule:
    """Delay compensation (DC-ASGD, Zheng et al. 2017) of a gradient ``g`` computed on
    ``backup`` and applied at ``params``:

    * constant (DC-ASGD-c): ``g + lam * g * g * (w_now - w_backup)``
    * adaptive (DC-ASGD-a): ``lam`` becomes ``lam / sqrt(meansquare + eps)`` where
      ``meansquare`` is a moving average of ``g * g`` (elementwise), bias-corrected as in
      Adam (``/ (1 - momentum**t)``). The paper's average starts at zero without the
      correction, which makes the first steps' lambda up to 1/sqrt(1 - momentum) = 4.5x too
      large; measured here, LeNet-5 with 8 workers and lam = 2 diverged (NaN) without it.

    Put it first in a chain, before the learning rate. ``lam = 0`` is plain ASGD.
    """

    def init(params):
        return DcState(_zeros(params) if adaptive else [], torch.zeros((), dtype=torch.int64))

    def update(updates, state, params=None, *, staleness=0, backup=None):
        if params is None or backup is None:
            raise ValueError("dc_asgd needs params= and backup= (the worker's pulled weights)")
        if lam == 0.0:
            return list(updates), state
        ms, count = state.mean_sq, state.count + 1
        if adaptive:
            ms = [momentum * m + (1 - momentum) * g * g for m, g in zip(ms, updates)]
            correction = 1.0 - momentum ** int(count)
            lams = [lam / (m / correction + eps).sqrt() for m in ms]
        else:
            lams = [lam] * len(updates)
        out = [g + lm * g * g * (w - b) for g, lm, w, b in zip(updates, lams, params, backup)]
        return out, DcState(ms, count)

    return UpdateRule(init, update)


# ---- learning-rate schedules: step -> learning rate -------------------------------------


def constant_schedule(lr: float) -> Schedule:
    return lambda step: lr


def step_decay_schedule(lr: float, step_size: int, gamma: float) -> Schedule:
    return lambda step: lr * gamma ** (step // step_size)


def cosine_schedule(lr: float, total_steps: int, final: float = 0.0) -> Schedule:
    total = max(total_steps, 1)

    def fn(step: int) -> float:
        t = min(step, total) / total
        return final + 0.5 * (lr - final) * (1 + math.cos(math.pi * t))

    return fn


def warmup(schedule: Schedule, warmup_steps: int) -> Schedule:
    """Linear warm-up from lr/warmup_steps to the schedule's value over ``warmup_steps``."""
    if warmup_steps <= 0:
        return schedule
    return lambda step: schedule(step) * min(1.0, (step + 1) / warmup_steps)
