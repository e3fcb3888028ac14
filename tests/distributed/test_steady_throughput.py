"""Two throughput figures (issue 27): steady-state samples/s leaves process start-up and
the final evaluation out; ``startup_s`` reports start-up beside it. Both come from the
run's own events (``phalanx.metrics.throughput``)."""

from __future__ import annotations

import pytest

import phalanx
from phalanx.metrics.throughput import latest_attempt, measure


def test_sync_steady_rate_agrees_with_its_train_events(tmp_path):
    r = phalanx.train("mlp", "synthetic", strategy="sync", workers=2, batch_size=16,
                      max_steps=200, progress=False, tensorboard=False, eval_every=10**6,
                      out=str(tmp_path))
    s = r.summary
    by_rank: dict[int, list[dict]] = {}
    for e in r.history:
        if e["kind"] == "train":
            by_rank.setdefault(e["rank"], []).append(e)
    assert set(by_rank) == {0, 1}
    # the rate each rank's train events show between its first and last, summed
    from_events = sum((v[-1]["samples"] - v[0]["samples"]) / (v[-1]["wall_s"] - v[0]["wall_s"])
                      for v in by_rank.values())
    assert abs(s["samples_per_s"] - from_events) <= 0.15 * from_events, (s, from_events)
    # the wall clock holds start-up, training and the final evaluation, in that order
    assert s["startup_s"] > 0 and s["train_s"] > 0
    assert s["startup_s"] + s["train_s"] < s["wall_s"]
    # the steady rate is the run's samples over its training time, not over the wall time
    assert s["samples_per_s"] == pytest.approx(s["train_samples"] / s["train_s"])
    assert s["samples_per_s"] > s["train_samples"] / s["wall_s"]


def test_measure_uses_the_last_attempt_and_the_slowest_rank_to_be_ready():
    events = [
        {"kind": "start", "unix": 0.0}, {"kind": "ready", "unix": 1.0},
        {"kind": "train", "unix": 50.0},                       # an earlier attempt
        {"kind": "start", "unix": 100.0},
        {"kind": "ready", "unix": 102.0}, {"kind": "ready", "unix": 104.0},
        {"kind": "train", "unix": 105.0}, {"kind": "train", "unix": 109.0},
        {"kind": "eval", "unix": 111.0},                       # the final evaluation: out
    ]
    assert latest_attempt(events)[0]["unix"] == 100.0
    t = measure(events, train_samples=500)
    assert (t.startup_s, t.train_s, t.samples_per_s) == (4.0, 5.0, 100.0)
    assert measure([{"kind": "start", "unix": 0.0}], 10).samples_per_s is None
