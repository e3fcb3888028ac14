"""The averaging round when it is more than a plain mean of the parameters: compressed
parameter deltas (``--compress``) and the DiLoCo outer optimizer (``--outer-rule``).

DiLoCo (Douillard et al. 2023): every H inner steps, the *pseudo-gradient* is the
parameters at the last sync (the anchor) minus the average of the workers' parameters; an
outer rule (SGD or Nesterov momentum, a :mod:`phalanx.rules` rule like any other) turns it
into the step from the anchor. ``--outer-rule sgd --outer-lr 1`` lands exactly on the
average: today's ``--strategy average``.

With compression each worker sends its delta (own parameters minus the anchor) through
:meth:`~phalanx.comm.exchange.Compression.mean_`, with error feedback; the replicas stay
identical because every rank decodes the same messages.
"""

from __future__ import annotations

import torch

from phalanx.comm.allreduce import AllReduce
from phalanx.comm.exchange import Compression
from phalanx.config import RunConfig
from phalanx.rules import UpdateRule, apply_updates, momentum, sgd

AVERAGING_KEY = "parameter delta"  # error-feedback key of the averaging round


def outer_rule(cfg: RunConfig) -> UpdateRule:
    """The outer optimizer; plain averaging is SGD with learning rate 1."""
    if cfg.outer_rule == "nesterov":
        return momentum(cfg.outer_lr, cfg.outer_momentum, nesterov=True)
    return sgd(cfg.outer_lr if cfg.outer_rule else 1.0)


class OuterSync:
    """One worker's side of the averaging rounds; :meth:`sync` replaces ``weights`` by the
    new common parameters (a collective: every rank calls it at the same step)."""

    def __init__(self, cfg: RunConfig, weights: list[torch.Tensor], allreduce: AllReduce,
                 world: int, compression: Compression | None = None) -> None:
        self.allreduce, self.world = allreduce, world
        self.compression = compression or Compression.from_config(cfg)
        self.rule = outer_rule(cfg)
        self.anchor = [w.detach().clone() for w in weights]
        self.state = self.rule.init(self.anchor)
        self.shapes = [w.shape for w in weights]

    @staticmethod
    def wanted(cfg: RunConfig) -> bool:
        """False: the round is today's plain parameter average."""
        return bool(cfg.outer_rule) or cfg.compress != "none"

    def sync(self, weights: list[torch.Tensor]) -> None:
        if self.compression.active:
            delta = torch.cat([(w - a).reshape(-1) for w, a in zip(weights, self.anchor)])
            self.compression.mean_(delta, self.shapes, self.allreduce, self.world,
                                   AVERAGING_KEY)
            pseudo_flat = delta.neg_()  # anchor - (anchor + mean delta)
        else:
            avg = torch.cat([w.detach().reshape(-1) for w in weights])
            self.allreduce(avg)
            avg.div_(self.world)
            pseudo_flat = torch.cat([a.reshape(-1) for a in self.anchor]) - avg
        pseudo, o = [], 0
        for a in self.anchor:
            pseudo.append(pseudo_flat[o : o + a.numel()].view_as(a))
            o += a.numel()
        updates, self.state = self.rule.update(pseudo, self.state, self.anchor)
        apply_updates(self.anchor, updates)
        with torch.no_grad():
            for w, a in zip(weights, self.anchor):
                w.copy_(a)
