"""Sufficient factors for fully connected layers (Xie et al., "sufficient factor broadcasting").

For ``y = x W^T + b`` over a batch of B rows, the weight gradient is a sum of B outer
products: ``dW = U^T V`` with U = dL/dy (B x m) and V = x (B x n). Sending U and V costs
B (m + n) numbers instead of m n, which is smaller when the batch is small against the
layer's width. Every rank gathers every rank's factors and rebuilds the summed gradient
exactly (the same ``U^T V`` product autograd computes).

Against a ring allreduce of the matrix (2 m n (N-1)/N numbers sent per rank), gathering
factors costs (N-1) B (m + n) per rank, so a layer uses factors when ``N B (m+n) < 2 m n``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from phalanx.comm.allreduce import AllReduce
from phalanx.comm.bucketing import CommThread


def factor_numel(rows: int, out_features: int, in_features: int) -> int:
    return rows * (out_features + in_features)


def use_factors(rows: int, out_features: int, in_features: int, world: int) -> bool:
    """True when gathering the factors sends fewer bytes than ring-allreducing the matrix."""
    return world > 1 and world * factor_numel(rows, out_features, in_features) < (
        2 * out_features * in_features)


def rebuild(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``sum_i u_i v_i^T`` for factor rows u (B x m), v (B x n): the m x n weight gradient."""
    return u.t().mm(v)


def pack(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.cat([u.reshape(-1), v.reshape(-1)])


def unpack(flat: torch.Tensor, rows: int, out_features: int,
           in_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    split = rows * out_features
    return flat[:split].view(rows, out_features), flat[split:].view(rows, in_features)


class _Layer:
    def __init__(self, module: nn.Linear) -> None:
        self.module = module
        # (U, V) pairs of this optimizer step: one per forward call per micro-step (a layer
        # used twice in one forward contributes two pairs, matched by the closure below)
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.pending = 0  # forward calls whose output gradient has not arrived yet
        self.gathered: list[torch.Tensor] | None = None


class SufficientFactors:
    """Replaces the allreduce of chosen ``nn.Linear`` weights by a gather of their factors.

    Hooks record V (the layer input, forward) and U (the output gradient, backward) on each
    micro-step; on the final micro-step U's hook submits the gather to the comm thread, so it
    overlaps the rest of backward like a bucket does. ``finish()`` rebuilds the averaged
    weight gradients into ``.grad`` after backward (autograd writes ``.grad`` until then).
    """

    def __init__(self, layers: Sequence[nn.Linear], allreduce: AllReduce, world: int,
                 comm: CommThread) -> None:
        self.layers = [_Layer(m) for m in layers]
        self.allreduce, self.world, self.comm = allreduce, world, comm
        self._sync = False
        self._handles = [layer.module.register_forward_hook(self._forward_hook(layer))
                         for layer in self.layers]

    @staticmethod
    def plan(model: nn.Module, rows: int, world: int) -> list[nn.Linear]:
        """The Linear layers (with a trainable weight) where factors are smaller, for ``rows``
        factor rows per step (batch size x accumulation steps)."""
        return [m for m in model.modules() if isinstance(m, nn.Linear) and m.weight.requires_grad
                and use_factors(rows, m.out_features, m.in_features, world)]

    def parameters(self) -> list[nn.Parameter]:
        return [layer.module.weight for layer in self.layers]

    def begin(self, sync: bool) -> None:
        self._sync = sync

    def _forward_hook(self, layer: _Layer):
        def hook(module: nn.Linear, args: tuple, output: torch.Tensor) -> None:
            if not torch.is_grad_enabled() or not output.requires_grad:
                return  # evaluation: nothing to factor
            v = args[0].detach().reshape(-1, module.in_features)
            layer.pending += 1
            sync = self._sync
            output.register_hook(lambda g: self._on_output_grad(layer, g, v, sync))

        return hook

    def _on_output_grad(self, layer: _Layer, grad: torch.Tensor, v: torch.Tensor,
                        sync: bool) -> None:
        layer.pairs.append((grad.detach().reshape(-1, layer.module.out_features), v))
        layer.pending -= 1
        if not sync or layer.pending:
            return
        u = torch.cat([pair[0] for pair in layer.pairs])
        v = torch.cat([pair[1] for pair in layer.pairs])
        layer.pairs = []
        packed = pack(u, v)

        def gather() -> None:
            layer.gathered = self.allreduce.all_gather(packed)

        self.comm.submit(gather)

    def finish(self) -> None:
        """Call after the comm thread drained: the averaged weight gradient of each layer."""
        if not self._sync:
            return
        for layer in self.layers:
            if layer.gathered is None:
                raise RuntimeError(f"sfb: no factors were gathered for {layer.module}")
            m, n = layer.module.out_features, layer.module.in_features
            rows = layer.gathered[0].numel() // (m + n)
            total = None
            for flat in layer.gathered:  # rank order, so every rank sums identically
                g = rebuild(*unpack(flat, rows, m, n))
                total = g if total is None else total.add_(g)
            total.div_(self.world)
            layer.module.weight.grad = total
            layer.gathered = None

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
