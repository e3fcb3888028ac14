"""The click model's sparse rows on the wire (real processes over gloo, 2 workers):

- ``asp``: the parameter server (1 shard), which pulls and pushes only the rows a batch
  reads, plus the MLP's dense part;
- ``sync_dense``: sync data parallel allreducing the densified table (every value of it);
- ``sync_sparse``: sync with ``--sparse-allreduce`` (gloo's sparse allreduce of the
  touched rows).

Same model (``--model ctr``, 26 fields x 65,536 rows x 16 = 27.3M table parameters by
default), data (``ctr-synthetic``), batch and steps. Per run: bytes per worker step (every
process's sends, over steps x workers; sync's start-up broadcast of the weights is left
out, a step's traffic is what is compared) and samples/s (the runs' own steady-state rate).
Ratios: the dense table's bytes over each sparse path's bytes per worker step (target >= 50)
and sync dense over sync sparse. This machine has 2 shared cores: the 1-minute load
average before and after is in the results.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import _common

from phalanx.entry.api import train

FIELDS = 26
RUNS = {
    "asp": {"strategy": "asp", "servers": 1},
    "sync_dense": {"strategy": "sync"},
    "sync_sparse": {"strategy": "sync", "sparse_allreduce": True},
}


def run(name: str, base: dict, tmp: str) -> dict:
    r = train(**base, **RUNS[name], out=str(Path(tmp) / name))
    s = r.summary
    worker_steps = s["steps"] * base["workers"]
    sent = s["bytes_sent"]
    if RUNS[name]["strategy"] == "sync":
        # not a step's: rank 0's start-up broadcast of every weight (the table too) to the
        # other replicas; the parameter server's shards start from the same seed instead
        params = sum(p.numel() for p in r.model.parameters())
        sent -= params * 4 * (base["workers"] - 1)
    return {"bytes_per_worker_step": sent / worker_steps,
            "samples_per_s": s["samples_per_s"], "test_loss": s["test_loss"],
            "test_auc": s["test_auc"], "steps": s["steps"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer samples and steps")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (where CUDA exists)")
    ap.add_argument("--rows", type=int, default=65536, help="--ctr-rows")
    ap.add_argument("--dim", type=int, default=16, help="--ctr-dim")
    ap.add_argument("--batch-size", type=int, default=256)
    args = ap.parse_args()
    steps = 15 if args.quick else 60
    base = {"model": "ctr", "data": "ctr-synthetic", "workers": 2, "max_steps": steps,
            "batch_size": args.batch_size, "ctr_rows": args.rows, "ctr_dim": args.dim,
            "train_limit": 20_000 if args.quick else 100_000, "test_limit": 2000,
            "device": args.device, "threads": 1, "progress": False, "tensorboard": False}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: run(name, base, tmp) for name in RUNS}
    table = FIELDS * args.rows * args.dim * 4
    b = {k: v["bytes_per_worker_step"] for k, v in results.items()}
    ratios = {
        "table_over_asp": round(table / b["asp"], 1),
        "table_over_sync_sparse": round(table / b["sync_sparse"], 1),
        "sync_dense_over_sync_sparse": round(b["sync_dense"] / b["sync_sparse"], 1),
        "sync_sparse_over_dense_samples_per_s": round(
            results["sync_sparse"]["samples_per_s"] / results["sync_dense"]["samples_per_s"], 2),
        "asp_over_sync_dense_samples_per_s": round(
            results["asp"]["samples_per_s"] / results["sync_dense"]["samples_per_s"], 2),
    }
    _common.emit("ctr", {**results, "table_bytes": table, "batch_size": args.batch_size,
                         "device": args.device, "load_1min_before": round(load_before, 2),
                         "load_1min_after": round(os.getloadavg()[0], 2)},
                 ratios, {"table_over_asp": 50, "table_over_sync_sparse": 50})


if __name__ == "__main__":
    main()
