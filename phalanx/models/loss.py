"""The loss and accuracy every strategy trains with, for every task.

Predictions are on the last dimension: (B, classes) for an image classifier, (B, T, vocab)
for a language model (every position predicts its next token), (B, 2) for the click
model (logits 0 and z: softmax is then the logistic sigmoid(z), so this cross-entropy is
its log-loss). Flattening all leading dimensions makes one loss of all three: for (B, C) it
is ``cross_entropy`` itself, bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def token_cross_entropy(out: torch.Tensor, y: torch.Tensor, reduction: str = "mean"
                        ) -> torch.Tensor:
    """Mean (or summed) cross-entropy over every prediction: samples, or tokens."""
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), reduction=reduction)


class TokenCrossEntropy(nn.Module):
    """:func:`token_cross_entropy` as a module (a loss function pipeline schedules call)."""

    def forward(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return token_cross_entropy(out, y)


def correct(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """How many predictions (samples, or tokens) are right: a 0-d tensor."""
    return (out.argmax(-1) == y).sum()
