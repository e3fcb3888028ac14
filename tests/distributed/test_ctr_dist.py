"""The click model's sparse rows with real processes: a parameter-server worker pushes and
pulls only the rows its batch reads (bytes counted against the formula), and sync's
``--sparse-allreduce`` ends at the dense allreduce's weights with far fewer bytes."""

from __future__ import annotations

import itertools

import torch

import phalanx
from phalanx.comm.wire import HEADER_BYTES
from phalanx.config import RunConfig
from phalanx.entry.api import make_job
from phalanx.models.ctr import table_rows
from phalanx.parallel.loop import batch_stream
from phalanx.parallel.registry import check_config
from phalanx.ps.partition import partition

ROWS, DIM, BATCH = 1000, 8, 32
SMALL = {"model": "ctr", "data": "ctr-synthetic", "ctr_rows": ROWS, "ctr_dim": DIM,
         "train_limit": 3000, "test_limit": 500, "batch_size": BATCH, "workers": 2,
         "progress": False, "tensorboard": False, "threads": 1}


def worker_sent(events: list[dict], rank: int) -> dict[int, int]:
    """step -> bytes the worker had sent by then (its train events)."""
    return {e["step"]: e["bytes_sent"] for e in events
            if e.get("kind") == "train" and e.get("rank") == rank and "bytes_sent" in e}


def test_ps_worker_pushes_and_pulls_only_the_rows_its_batch_reads(tmp_path):
    opts = {**SMALL, "strategy": "asp", "servers": 1, "max_steps": 20,
            "out": str(tmp_path / "asp")}
    r = phalanx.train(**opts)
    sent = worker_sent(r.events, 1)  # worker 0 is rank 1, after the one server
    assert 10 in sent and 20 in sent, sent
    # replay worker 0's batches 11..20: what it must have sent for them
    cfg = check_config(RunConfig.from_mapping(opts))
    job = make_job(cfg)
    model = job.build_model()
    part = partition(model, 1)
    dense = part.dense_numel
    batches = itertools.islice(batch_stream(job.shard(0, 2), BATCH, cfg.seed), 10, 20)
    rows = [table_rows(model, job.train.x[idx]).numel() for _, idx in batches]
    # per step: one pull (its header + the row ids) and one push (header, the dense
    # gradient, the row ids and the rows' gradients)
    expected = sum(2 * HEADER_BYTES + 4 * dense + r * (8 + 8 + 4 * DIM) for r in rows)
    measured = sent[20] - sent[10]
    assert abs(measured - expected) <= 0.01 * expected, (measured, expected)
    table = 26 * ROWS * DIM * 4
    assert measured / 10 < table / 4  # a step moves far less than the table once


def test_sync_sparse_allreduce_equals_dense_with_fewer_bytes(tmp_path):
    opts = {**SMALL, "strategy": "sync", "max_steps": 12}
    dense = phalanx.train(**opts, out=str(tmp_path / "dense"))
    sparse = phalanx.train(**opts, sparse_allreduce=True, out=str(tmp_path / "sparse"))
    for (name, p), q in zip(dense.model.named_parameters(), sparse.model.parameters()):
        assert torch.allclose(p, q, atol=1e-5, rtol=0), name
    ratio = dense.summary["bytes_sent"] / sparse.summary["bytes_sent"]
    assert ratio > 5, (dense.summary["bytes_sent"], sparse.summary["bytes_sent"])
