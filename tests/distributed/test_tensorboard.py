"""TensorBoard (issue 27): one TensorBoard run per training run, per-rank tags inside it,
staleness, bytes and the steady-state samples/s as scalars, and no empty run."""

from __future__ import annotations

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import phalanx


def _scalars(folder) -> dict[str, list[float]]:
    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [s.value for s in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_asp_run_is_one_tensorboard_run_with_rank_tags(tmp_path):
    r = phalanx.train("mlp", "synthetic", strategy="asp", workers=2, servers=1,
                      batch_size=16, max_steps=30, eval_every=15, progress=False,
                      out=str(tmp_path))
    tb = tmp_path / "tensorboard"
    assert [p for p in tb.iterdir() if p.is_dir()] == []  # one run: no per-rank folders
    files = list(tb.iterdir())
    assert files and all(p.name.startswith("events.out.tfevents") for p in files)
    scalars = _scalars(tb)
    # the two workers (ranks 1 and 2; rank 0 is the shard) each have their own curve
    assert len(scalars["rank1/train/loss"]) == 3 and len(scalars["rank2/train/loss"]) == 3
    assert "rank1/train/samples_per_s" in scalars
    # worker 0 evaluates: one eval curve for the run, not one under some rank's name
    assert len(scalars["eval/test_accuracy"]) == 2
    # the shard's applied pushes, with their staleness, and the summary's figures
    stale = scalars["rank0/apply/staleness"]
    assert len(stale) == r.summary["pushes_applied"] and max(stale) >= 1
    assert scalars["summary/samples_per_s"] == [pytest.approx(r.summary["samples_per_s"], rel=1e-6)]
    assert scalars["summary/startup_s"] == [pytest.approx(r.summary["startup_s"], rel=1e-6)]
    assert scalars["summary/test_accuracy"] == [pytest.approx(r.summary["test_accuracy"], rel=1e-6)]
    assert any("bytes" in tag for tag in scalars)
    # every file holds scalars (a process with nothing to plot writes no file)
    for f in files:
        assert _scalars_in(f), f.name


def _scalars_in(path) -> int:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    return sum(1 for e in EventFileLoader(str(path)).Load()
               if e.summary and len(e.summary.value))
