"""ZeRO stage 3 evaluates unit by unit (each block gathered by its forward, freed after it;
every rank runs the evaluation's forwards, rank 0 scores): its eval events equal sync's,
where every rank holds the whole model, at every evaluation."""

from __future__ import annotations

import phalanx

TINY = {"model": "gpt", "gpt_layers": 2, "gpt_dim": 32, "gpt_heads": 2, "context": 32,
        "data": "shakespeare", "train_limit": 2000, "test_limit": 100, "max_steps": 6,
        "eval_every": 2, "rule": "adamw", "workers": 3, "seed": 2, "progress": False,
        "tensorboard": False}


def _evals(run) -> list[tuple[int, float, float]]:
    return [(e["step"], e["test_loss"], e["test_accuracy"]) for e in run.history
            if e.get("kind") == "eval"]


def test_stage3_unit_by_unit_evaluation_equals_sync(tmp_path):
    sync = phalanx.train(strategy="sync", allreduce="ring", out=str(tmp_path / "s"), **TINY)
    z3 = phalanx.train(strategy="zero", zero_stage=3, allreduce="ring",
                       out=str(tmp_path / "z3"), **TINY)
    a, b = _evals(sync), _evals(z3)
    assert [s for s, _, _ in a] == [s for s, _, _ in b] and len(a) >= 3
    for (_, la, aa), (_, lb, ab) in zip(a, b):
        assert abs(la - lb) < 1e-5 and abs(aa - ab) < 1e-6, (a, b)
