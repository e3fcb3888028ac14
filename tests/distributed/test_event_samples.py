"""One convention for the ``samples`` field of ``train`` events (docs/events.md): the
samples of the rank's own batches. Summed over the ranks that draw distinct batches it is
the run's total, for every strategy (it used to be the global count for sync / average)."""

from __future__ import annotations

import pytest

import phalanx


@pytest.mark.parametrize("strategy", ["sync", "average", "asp", "hogwild"])
def test_ranks_train_samples_sum_to_the_runs_total(tmp_path, strategy):
    r = phalanx.train("mlp", "synthetic", strategy=strategy, workers=2, servers=1,
                      batch_size=16, max_steps=10, lr=0.05, progress=False,
                      tensorboard=False, eval_every=10**6, out=str(tmp_path))
    last: dict[int, int] = {}
    for e in r.history:
        if e["kind"] == "train":
            last[e["rank"]] = e["samples"]
    assert len(last) == 2  # both workers log
    assert sum(last.values()) == r.summary["train_samples"] == 2 * 10 * 16
