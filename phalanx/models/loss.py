"""The loss and accuracy every strategy trains with, for every task.

Predictions are on the last dimension: (B, classes) for an image classifier, (B, T, vocab)
for a language model (every position predicts its next token), (B, 2) for the click
model (logits 0 and z: softmax is then the logistic sigmoid(z), so this cross-entropy is
its log-loss). Flattening all leading dimensions makes one loss of all three: for (B, C) it
is ``cross_entropy`` itself, bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from phalanx.errors import ConfigError

RETURNS = ("the forward must return the logits (a tensor), a tuple whose first item is "
           "the logits (nanoGPT's and minGPT's (logits, loss)), or an object or dict with "
           "logits (Hugging Face's)")


def logits_of(out: Any, y: torch.Tensor | None = None) -> torch.Tensor:
    """The logits in what a model's forward returned, as models are written: a tensor; a
    tuple or list whose first item is the logits (nanoGPT's and minGPT's ``(logits,
    loss)``); an object with ``.logits`` or a dict with ``"logits"`` (Hugging Face's). With
    ``y``: one prediction per target (nanoGPT's forward without targets returns the last
    position's only), else one line that says so."""
    logits = out
    if isinstance(out, (tuple, list)) and out:
        logits = out[0]
    elif isinstance(out, dict):
        logits = out.get("logits")
    elif not isinstance(out, torch.Tensor):
        logits = getattr(out, "logits", None)
    if not isinstance(logits, torch.Tensor):
        raise ConfigError(f"the model's forward returned {type(out).__name__}: {RETURNS}")
    if y is not None and logits.shape[:-1] != y.shape:
        raise ConfigError(f"the model's forward returned logits of shape {tuple(logits.shape)} "
                          f"for targets of shape {tuple(y.shape)}: one prediction per target "
                          "is needed (a nanoGPT-style model called without targets returns "
                          "only the last position's; return every position's logits)")
    return logits


def token_cross_entropy(out: Any, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Mean (or summed) cross-entropy over every prediction: samples, or tokens. ``out``:
    what the model returned (:func:`logits_of`)."""
    # in fp32 whatever the forward computed in (--precision bf16: the loss is fp32's; a
    # no-op on fp32 logits)
    out = logits_of(out, y).float()
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), reduction=reduction)


class TokenCrossEntropy(nn.Module):
    """:func:`token_cross_entropy` as a module (a loss function pipeline schedules call)."""

    def forward(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return token_cross_entropy(out, y)


def correct(out: Any, y: torch.Tensor) -> torch.Tensor:
    """How many predictions (samples, or tokens) are right: a 0-d tensor."""
    return (logits_of(out, y).argmax(-1) == y).sum()
