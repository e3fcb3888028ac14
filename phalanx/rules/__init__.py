"""Update rules: small ``init/update`` pairs and the named optimizers built from them.

``sgd``       = [weight decay] -> lr
``momentum``  = [weight decay] -> trace(mu) -> lr
``adagrad``, ``rmsprop``, ``adam`` likewise; ``staleness_scaled`` and ``dc_asgd`` are
prepended on a parameter server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from phalanx.catalog import Catalog
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
    clip_by_global_norm,
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
    "Schedule", "add_decayed_weights", "clip_by_global_norm", "constant_schedule",
    "cosine_schedule", "dc_asgd",
    "scale", "scale_by_adagrad", "scale_by_adam", "scale_by_rms", "scale_by_schedule",
    "staleness_scaled", "step_decay_schedule", "trace", "warmup",
    "sgd", "momentum", "adagrad", "rmsprop", "adam", "adamw", "make_schedule", "make_rule", "RULES",
    "RuleKind",
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


def adamw(lr: float | Schedule, weight_decay: float = 0.01, b1: float = 0.9,
          b2: float = 0.999, eps: float = 1e-8) -> UpdateRule:
    """Adam with decoupled weight decay (Loshchilov and Hutter): ``u = -lr (adam(g) + wd p)``,
    i.e. ``torch.optim.AdamW``'s ``p *= 1 - lr wd`` then the Adam step."""
    decay = [add_decayed_weights(weight_decay)] if weight_decay else []
    return chain(scale_by_adam(b1, b2, eps), *decay, scale_by_schedule(_as_schedule(lr)))


@dataclass(frozen=True)
class RuleKind:
    """An update rule a user picks with ``--rule``: how a run configuration builds it (on
    the learning-rate schedule) and the learning rate it starts from when ``--lr`` is not
    given."""

    build: Callable[[Any, Schedule], UpdateRule]
    default_lr: float


# every rule --rule offers: adding one is its builder and one line here
RULES: Catalog[RuleKind] = Catalog("update rule", "--rule")
RULES.add("sgd", RuleKind(lambda c, lr: sgd(lr, c.weight_decay), 0.05), "plain SGD")
RULES.add("momentum", RuleKind(lambda c, lr: momentum(lr, c.momentum, c.weight_decay), 0.01),
          "heavy-ball momentum (--momentum)")
RULES.add("nesterov", RuleKind(lambda c, lr: momentum(lr, c.momentum, c.weight_decay,
                                                      nesterov=True), 0.01),
          "Nesterov momentum (--momentum)")
RULES.add("adagrad", RuleKind(lambda c, lr: adagrad(lr, c.weight_decay), 0.01), "AdaGrad")
RULES.add("rmsprop", RuleKind(lambda c, lr: rmsprop(lr, c.weight_decay), 0.001), "RMSProp")
RULES.add("adam", RuleKind(lambda c, lr: adam(lr, c.weight_decay), 0.001), "Adam")
RULES.add("adamw", RuleKind(lambda c, lr: adamw(lr, c.weight_decay), 0.001),
          "Adam with decoupled weight decay (--weight-decay)")


# every learning-rate schedule --schedule offers: adding one is its function and one line
# here; an entry makes it from (the run configuration, the starting rate, the run's steps)
ScheduleFactory = Callable[[Any, float, int], Schedule]
SCHEDULES: Catalog[ScheduleFactory] = Catalog("learning-rate schedule", "--schedule")
SCHEDULES.add("constant", lambda c, lr, steps: constant_schedule(lr), "the same rate throughout")
SCHEDULES.add("step", lambda c, lr, steps: step_decay_schedule(lr, c.step_size, c.gamma),
              "x --gamma every --step-size steps")
SCHEDULES.add("cosine", lambda c, lr, steps: cosine_schedule(lr, steps),
              "cosine decay to 0 over the run")


def make_schedule(cfg, total_steps: int) -> Schedule:
    """The learning-rate schedule a :class:`~phalanx.config.RunConfig` asks for (``--lr``
    left out: the rule's own start)."""
    lr = cfg.lr if cfg.lr is not None else RULES.get(cfg.rule).default_lr
    return warmup(SCHEDULES.get(cfg.schedule)(cfg, lr, total_steps), cfg.warmup_steps)


def make_rule(cfg, total_steps: int = 0, *, prefix: tuple[UpdateRule, ...] = ()) -> UpdateRule:
    """The update rule of a run configuration; ``prefix`` rules (DC-ASGD, staleness
    scaling) run on the raw gradient before the optimizer."""
    rule = RULES.get(cfg.rule).build(cfg, make_schedule(cfg, total_steps))
    # the gradient is clipped first, as the rule receives it: after the allreduce in sync,
    # on each shard's slice on a parameter server, per stage in a pipeline
    clip = (clip_by_global_norm(cfg.clip_grad_norm),) if getattr(cfg, "clip_grad_norm", 0) else ()
    head = clip + tuple(prefix)
    return chain(*head, rule) if head else rule
