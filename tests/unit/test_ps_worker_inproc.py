"""The parameter-server worker loop (``PSWorker``) on the in-process transport, by value:
what it reports at DONE (samples, steps, bytes, dropped, skipped, clipped), a pull asked
ahead (one step staler, exactly), evaluation cadence, compressed pushes with an injected
inf and overflow, and a lossy link. Written against the survivors of ``make mutate``; the
real-process versions are in tests/distributed/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import test_ps_inproc
import torch
from test_ps_inproc import job_for, run_threads

from phalanx.metrics import EventLog
from phalanx.parallel import ps_worker
from phalanx.parallel.ps_worker import WorkerStats, steps_per_worker

STEPS, BATCH = 12, 16


def _events(job) -> list[dict]:
    path = job.run_dir / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_done_reports_what_the_workers_did(tmp_path: Path) -> None:
    job = job_for(tmp_path, strategy="asp", workers=2, servers=2, max_steps=STEPS,
                  batch_size=BATCH)
    assert steps_per_worker(job) == STEPS
    out = run_threads(job)
    s = out.stats
    assert out.steps == STEPS and out.train_samples == 2 * STEPS * BATCH
    assert s["pushes_applied"] == 2 * 2 * STEPS and s["pushes_rejected"] == 0
    assert (s["pushes_dropped"], s["pushes_skipped"], s["values_clipped"]) == (0, 0, 0)
    assert s["staleness_histogram"][0] > 0 and s["bytes_sent"] > 0
    assert WorkerStats.from_tensor(WorkerStats(steps=3, values_clipped=2).tensor()) == \
        WorkerStats(steps=3, values_clipped=2)


def test_a_pull_ahead_is_one_step_staler(tmp_path: Path) -> None:
    base = run_threads(job_for(tmp_path / "a", strategy="asp", workers=1, servers=1,
                               max_steps=STEPS, batch_size=BATCH))
    ahead = run_threads(job_for(tmp_path / "b", strategy="asp", workers=1, servers=1,
                                max_steps=STEPS, batch_size=BATCH, pull_ahead=True))
    assert base.stats["staleness_histogram"] == [STEPS]
    # step s+1's weights are asked for before step s is pushed: every push but the first
    # was computed one version behind
    assert ahead.stats["staleness_histogram"] == [1, STEPS - 1]
    moved = max((p - q).abs().max().item() for p, q in
                zip(base.model.parameters(), ahead.model.parameters()))
    assert moved > 0


def test_downpour_pushes_every_npush_and_evaluates_every_k(tmp_path: Path,
                                                           monkeypatch) -> None:
    job = job_for(tmp_path, strategy="downpour", workers=2, servers=1, max_steps=STEPS,
                  batch_size=BATCH, nfetch=2, npush=3, eval_every=4)
    job.run_dir.mkdir(parents=True, exist_ok=True)
    main = ps_worker.worker_main

    def logging_worker(job, transport, layout, worker, log, *args):
        with EventLog(job.run_dir / "events.jsonl", rank=worker + 1, role="worker") as own:
            main(job, transport, layout, worker, own, *args)

    monkeypatch.setattr(test_ps_inproc, "worker_main", logging_worker)
    out = run_threads(job)
    assert out.stats["pushes_applied"] == 2 * STEPS // 3
    evals = [e["step"] for e in _events(job) if e["kind"] == "eval"]
    assert evals[:3] == [4, 8, 12], evals


def test_compressed_pushes_count_a_skip_and_a_clip(tmp_path: Path) -> None:
    job = job_for(tmp_path, strategy="asp", workers=1, servers=1, max_steps=STEPS,
                  batch_size=BATCH, compress="fp16")
    build = job.build_model

    def injecting():
        model = build()
        calls = [0]

        def hook(g):
            calls[0] += 1
            if calls[0] in (2, 5):
                g = g.clone()
                g[0] = float("inf") if calls[0] == 2 else 2e5
            return g

        list(model.parameters())[1].register_hook(hook)
        return model

    job.build_model = injecting
    s = run_threads(job).stats
    assert (s["pushes_skipped"], s["pushes_rejected"]) == (1, 1)
    assert s["pushes_applied"] == STEPS - 1 and s["values_clipped"] >= 1


def test_a_lossy_link_is_counted_on_both_ends(tmp_path: Path) -> None:
    job = job_for(tmp_path, strategy="asp", workers=2, servers=1, max_steps=STEPS,
                  batch_size=BATCH, drop_messages=0.3)
    s = run_threads(job).stats
    assert s["pushes_dropped"] > 0 and s["pushes_dropped"] == s["pushes_lost"]
    assert s["pushes_applied"] + s["pushes_lost"] == 2 * STEPS
    assert torch.isfinite(torch.tensor(s["bytes_sent"], dtype=torch.float64))


def test_evaluation_reads_the_servers_weights(tmp_path: Path, monkeypatch) -> None:
    """Worker 0 evaluates what the shards hold (a fresh pull, after draining a pull asked
    ahead), not its local copy: the last eval (after the last push) is the final model's."""
    from phalanx.parallel.base import evaluate

    job = job_for(tmp_path, strategy="downpour", workers=1, servers=1, max_steps=STEPS,
                  batch_size=BATCH, nfetch=4, npush=1, eval_every=STEPS, pull_ahead=True)
    job.run_dir.mkdir(parents=True, exist_ok=True)
    main = ps_worker.worker_main

    def logging_worker(job, transport, layout, worker, log, *args):
        with EventLog(job.run_dir / "events.jsonl", rank=worker + 1, role="worker") as own:
            main(job, transport, layout, worker, own, *args)

    monkeypatch.setattr(test_ps_inproc, "worker_main", logging_worker)
    out = run_threads(job)
    last = [e for e in _events(job) if e["kind"] == "eval"][-1]
    loss, _ = evaluate(out.model, job.test)
    assert last["step"] == STEPS and last["test_loss"] == pytest.approx(loss, rel=1e-6)


def test_a_lossy_link_drops_the_same_pushes_for_the_same_seed(tmp_path: Path) -> None:
    runs = [run_threads(job_for(tmp_path / str(i), strategy="asp", workers=1, servers=1,
                                max_steps=STEPS, batch_size=BATCH, drop_messages=0.4, seed=s))
            for i, s in enumerate((3, 3, 4))]
    a, b, c = (r.stats["pushes_dropped"] for r in runs)
    assert a == b and 0 < a < STEPS
    same = all(torch.equal(p, q) for p, q in zip(runs[0].model.parameters(),
                                                   runs[1].model.parameters()))
    assert same


def test_several_epochs_equal_the_single_worker_loop(tmp_path: Path) -> None:
    """ASP with one worker is the single-worker loop exactly, over three epochs (each
    epoch's own batch order)."""
    from phalanx.metrics import EventLog as Log
    from phalanx.parallel import single

    kw = {"workers": 1, "servers": 1, "max_steps": 12, "batch_size": BATCH,
          "train_limit": 64, "epochs": 3, "rule": "momentum", "lr": 0.02}
    out = run_threads(job_for(tmp_path / "asp", strategy="asp", **kw))
    ref = single.run(job_for(tmp_path / "single", strategy="single", **kw), Log(None))
    assert out.steps == 12
    for p, q in zip(ref.model.parameters(), out.model.parameters()):
        assert torch.equal(p, q)
