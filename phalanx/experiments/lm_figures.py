"""A seeded study's figures when the data is text (a language model): validation loss and
perplexity, tokens/s and bytes per token, instead of test accuracy and samples/s.

A run is a language-model run when its summary carries ``test_perplexity`` (every run on
``--data shakespeare`` / ``text`` does). Loss is lower-better: the pairwise verdicts
negate it before :func:`~phalanx.experiments.stats.compare_higher`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# (summary key, what it is, format, higher is better) a comparison decides, pair by pair
LM_PAIRED = (("test_loss", "validation loss", ".4f", False),
             ("tokens_per_s", "steady-state tokens/s", ".0f", True))


def is_lm(summary: Mapping[str, Any]) -> bool:
    """A language model's run (its summary has a perplexity)."""
    return summary.get("test_perplexity") is not None


def context_of(summary: Mapping[str, Any]) -> int:
    return int(summary.get("data_context") or 1)


def bytes_per_token(summary: Mapping[str, Any]) -> float:
    """Bytes every rank sent, per training token (``bytes_sent / train_tokens``; from
    bytes per sample where a strategy reports only that: a sample is ``context`` tokens)."""
    sent, tokens = summary.get("bytes_sent"), summary.get("train_tokens")
    if sent is not None and tokens:
        return float(sent) / float(tokens)
    return float(summary.get("bytes_per_sample") or 0.0) / context_of(summary)


def value_of(summary: Mapping[str, Any], key: str) -> float:
    """A summary's number, with the derived ones (``bytes_per_token``) computed."""
    if key == "bytes_per_token":
        return bytes_per_token(summary)
    return float(summary.get(key) or 0.0)


def perplexity(loss: float) -> float:
    """exp(loss in nats per token), capped so a diverged run prints, not overflows."""
    return math.exp(min(loss, 50.0))


def lm_table(sr: Any) -> str:
    """One row per variant (a :class:`~phalanx.experiments.seeds.SeededRuns`), the fastest
    by steady-state tokens/s first: validation loss mean ± sd and its 95% interval, the
    perplexity of the mean loss, next-token accuracy, tokens/s, start-up, staleness and
    bytes per token."""
    head = ("| run | strategy | workers | seeds | val loss (mean ± sd) | 95% CI | perplexity | "
            "next-token acc | tokens/s (steady) | start-up (s) | staleness mean | "
            "staleness max | bytes/token |")
    lines = [head, "|" + "---|" * 13]
    for label in sorted(sr.labels, key=lambda lb: -sr.stat(lb, "tokens_per_s").mean):
        runs, s0 = sr.runs[label], sr.first(label).summary
        loss = sr.stat(label, "test_loss")
        stale_max = max(int(r.summary.get("staleness_max") or 0) for r in runs)
        lines.append("| " + " | ".join([
            label, str(s0.get("strategy", "?")), str(s0.get("workers", 1)), str(len(runs)),
            loss.fmt(), loss.fmt_ci(), f"{perplexity(loss.mean):.2f}",
            f"{sr.stat(label, 'test_accuracy').mean:.4f}",
            f"{sr.stat(label, 'tokens_per_s').mean:.0f}",
            f"{sr.stat(label, 'startup_s').mean:.1f}",
            "—" if s0.get("staleness_mean") is None
            else format(sr.stat(label, "staleness_mean").mean, ".2f"),
            "—" if s0.get("staleness_max") is None else str(stale_max),
            f"{sr.stat(label, 'bytes_per_token').mean:.0f}",
        ]) + " |")
    return "\n".join(lines)
