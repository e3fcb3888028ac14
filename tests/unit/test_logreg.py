"""``--model logreg``: one linear layer, no buffers, and it learns."""

from __future__ import annotations

import phalanx
from phalanx.models import build_model, count_parameters


def test_logreg_is_one_linear_layer_without_buffers():
    model = build_model("logreg", (1, 28, 28), 10)
    assert count_parameters(model) == 28 * 28 * 10 + 10
    assert list(model.buffers()) == []


def test_logreg_learns_with_the_single_strategy(tmp_path):
    result = phalanx.train("logreg", "synthetic", strategy="single", max_steps=60, lr=0.05,
                           progress=False, tensorboard=False, out=str(tmp_path))
    assert result.summary["test_accuracy"] > 0.5  # 10 classes: chance is 0.1
