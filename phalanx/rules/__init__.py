"""Update rules: small ``init/update`` pairs and the named optimizers built from them.

``sgd``       = [weight decay] -> lr
``momentum``  = [weight decay] -> trace(mu) -> lr
``adagrad``, ``rmsprop``, ``adam`` likewise; ``staleness_scaled`` and ``dc_asgd`` are
prepended on a parameter server.
"""

from __future__ import annotations

from phalanx.errors import ConfigError
from phalanx.rules.base import (
    ChainState,
    EmptyState,
    UpdateRule,
    apply_updates,
    chain,
    state_tensors,
    update_owned,
)
from phalanx.rules.transforms import (
    Schedule,
    add_decayed_weights,
    constant_schedule,
    cosine_schedule,
    dc_asgd,
    scale,
    scale_by_adagrad,
    scale_by_adam,
    scale_by_rms,
    scale_by_schedule,
    staleness_scaled,
    step_decay_schedule,
    trace,
    warmup,
)

__all__ = [
    "ChainState", "EmptyState", "UpdateRule", "apply_updates", "chain", "state_tensors",
    "update_owned",
    "Schedule", "add_decayed_weights", "constant_schedule", "cosine_schedule", "dc_asgd",
    "scale", "scale_by_adagrad", "scale_by_adam", "scale_by_rms", "scale_by_schedule",
    "staleness_scaled", "step_decay_schedule", "trace", "warmup",
    "sgd", "momentum", "adagrad", "rmsprop", "adam", "make_schedule", "make_rule", "RULES",
]


def _tail(lr_schedule: Schedule, weight_decay: float, *core: UpdateRule) -> UpdateRule:
    head = [add_decayed_weights(weight_decay)] if weight_decay else []
    return chain(*head, *core, scale_by_schedule(lr_schedule))


def _as_schedule(lr: float | Schedule) -> Schedule:
    return lr if callable(lr) else constant_schedule(float(lr))


def sgd(lr: float | Schedule, weight_decay: float = 0.0) -> UpdateRule:
    return _tail(_as_schedule(lr), weight_decay)


def momentum(lr: float | Schedule, mu: float = 0.9, weight_decay: float = 0.0,
             nesterov: bool = False) -> UpdateRule:
    return _tail(_as_schedule(lr), weight_decay, trace(mu, nesterov))


def adagrad(lr: float | Schedule, weight_decay: float = 0.0, eps: float = 1e-10) -> UpdateRule:
    return _tail(_as_schedule(lr), weight_decay, scale_by_adagrad(eps))


def rmsprop(lr: float | Schedule, weight_decay: float = 0.0, alpha: float = 0.99,
            eps: float = 1e-8) -> UpdateRule:
    return _tail(_as_schedule(lr), weight_decay, scale_by_rms(alpha, eps))


def adam(lr: float | Schedule, weight_decay: float = 0.0, b1: float = 0.9, b2: float = 0.999,
         eps: float = 1e-8) -> UpdateRule:
    return _tail(_as_schedule(lr), weight_decay, scale_by_adam(b1, b2, eps))


RULES = ("sgd", "momentum", "nesterov", "adagrad", "rmsprop", "adam")


def make_schedule(cfg, total_steps: int) -> Schedule:
    """The learning-rate schedule a :class:`~phalanx.config.RunConfig` asks for."""
    if cfg.schedule == "step":
        base = step_decay_schedule(cfg.lr, cfg.step_size, cfg.gamma)
    elif cfg.schedule == "cosine":
        base = cosine_schedule(cfg.lr, total_steps)
    else:
        base = constant_schedule(cfg.lr)
    return warmup(base, cfg.warmup_steps)


def make_rule(cfg, total_steps: int = 0, *, prefix: tuple[UpdateRule, ...] = ()) -> UpdateRule:
    """The update rule of a run configuration; ``prefix`` rules (DC-ASGD, staleness
    scaling) run on the raw gradient before the optimizer."""
    lr = make_schedule(cfg, total_steps)
    wd = cfg.weight_decay
    if cfg.rule == "sgd":
        rule = sgd(lr, wd)
    elif cfg.rule in ("momentum", "nesterov"):
        rule = momentum(lr, cfg.momentum, wd, nesterov=cfg.rule == "nesterov")
    elif cfg.rule == "adagrad":
        rule = adagrad(lr, wd)
    elif cfg.rule == "rmsprop":
        rule = rmsprop(lr, wd)
    elif cfg.rule == "adam":
        rule = adam(lr, wd)
    else:
        raise ConfigError(f"--rule: {cfg.rule!r} is not one of {', '.join(RULES)}")
    return chain(*prefix, rule) if prefix else rule
