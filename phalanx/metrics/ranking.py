"""Ranking metrics: the area under the ROC curve, exactly, ties included."""

from __future__ import annotations

import math

import torch


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC AUC: the probability that a random positive scores above a random negative, a
    tie counting one half (the Mann-Whitney U statistic over positives x negatives).

    Exact in O(n log n): sort the scores, give each group of equal scores its mean rank
    (so ties count a half), and U = sum of the positives' ranks - P (P + 1) / 2. NaN when
    one class is absent (no pair to rank)."""
    s = scores.detach().reshape(-1).double().cpu()
    y = labels.detach().reshape(-1).cpu() > 0
    pos = int(y.sum())
    neg = len(y) - pos
    if pos == 0 or neg == 0:
        return math.nan
    order = torch.argsort(s)
    sorted_s = s[order]
    _, inverse, counts = torch.unique_consecutive(sorted_s, return_inverse=True,
                                                  return_counts=True)
    ends = torch.cumsum(counts, 0).double()  # the last 1-based rank of each tie group
    mean_rank = ends - (counts.double() - 1) / 2
    ranks = mean_rank[inverse]
    u = float(ranks[y[order]].sum()) - pos * (pos + 1) / 2
    return u / (pos * neg)
