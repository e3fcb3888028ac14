"""Mixed precision (``--precision fp32|bf16``): what a run computes and sends in.

``bf16`` is the usual mixed precision of bf16 training (torch's autocast recipe, FSDP2's
``MixedPrecisionPolicy``, the ZeRO paper's fp16 scheme with bf16's range, so no loss
scaling is needed):

* the forward runs under ``torch.autocast`` (CPU and CUDA): matrix products in bf16,
  reductions and normalisations where autocast keeps them fp32;
* the loss is computed in fp32 (the logits are cast up before the cross-entropy:
  :func:`phalanx.models.loss.token_cross_entropy`);
* the master weights and the rule's state stay fp32: the rule updates fp32 tensors;
* gradients travel in bf16 where the strategy allows (:attr:`Precision.wire`): sync's
  bucketed allreduce (ours and the backend's), zero's reduce-scatter and all-gather,
  FSDP2's (its ``param_dtype`` / ``reduce_dtype``). The byte counters count what is sent,
  so they show half of fp32's.

Evaluations run under the same autocast as training. Which strategies take ``bf16`` is
declared by their specs (the ``bf16`` feature); the others refuse it in one line that says
why (:data:`REFUSALS`, read by :func:`phalanx.parallel.registry.check_precision`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

# why a strategy without the "bf16" feature refuses --precision bf16
REFUSALS = {
    "parameter-server": "its workers push fp32 gradients to the servers, whose rule is not "
                        "wired for mixed precision (--compress bf16 sends bf16)",
    "hogwild": "its workers add their updates into one shared fp32 copy of every weight "
               "without a master copy to round from",
    "model-parallel": "its stages hand activations and their gradients between processes "
                      "in fp32 and run their own forward, outside the shared autocast",
    "pipeline": "its stages hand activations and their gradients between processes in "
                "fp32 and its schedules run their own forward, outside the shared autocast",
    "hybrid": "its pipeline stages run their own forward outside the shared autocast",
    "tensor": "its column-parallel layers gather activations in fp32 through their own "
              "autograd functions, not wired for autocast",
    "sandblaster": "L-BFGS's curvature pairs and line search need fp32 gradients over the "
                   "whole batch",
}


@dataclass(frozen=True)
class Precision:
    """``--precision`` parsed: ``compute`` (None: fp32, no autocast) and ``wire``, the
    dtype gradients (and zero's gathered weights) travel in."""

    name: str = "fp32"

    @property
    def compute(self) -> torch.dtype | None:
        return torch.bfloat16 if self.name == "bf16" else None

    @property
    def wire(self) -> torch.dtype:
        return torch.bfloat16 if self.name == "bf16" else torch.float32

    @property
    def mixed(self) -> bool:
        return self.compute is not None

    def autocast(self, device: torch.device | str) -> contextlib.AbstractContextManager:
        """The forward's context: autocast to bf16 on ``device``'s type, else nothing."""
        if self.compute is None:
            return contextlib.nullcontext()
        kind = torch.device(device).type
        return torch.autocast(device_type=kind, dtype=self.compute)


FP32 = Precision()


def precision_of(cfg) -> Precision:
    """The run's :class:`Precision` (``cfg.precision`` was checked by the config)."""
    return Precision(cfg.precision)
