"""Throughput of our synchronous data parallel (overlapped buckets, ring and native
allreduce) against PyTorch DDP on the same model, data and batches, N = 2 and 4.
Ratio: ours / DDP samples per second (target >= 0.95). Each measurement excludes the
first WARMUP steps; runs alternate (DDP, ours, DDP, ...) and medians are reported.

    python bench/sync_dp.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from phalanx.config import RunConfig  # noqa: E402
from phalanx.data import load_data  # noqa: E402
from phalanx.entry.api import make_job  # noqa: E402
from phalanx.metrics import read_events  # noqa: E402
from phalanx.parallel import replicas, sync_dp  # noqa: E402
from phalanx.parallel.base import Job, read_result  # noqa: E402
from phalanx.runtime.launch import spawn  # noqa: E402

WARMUP = 10  # steps (a multiple of sync_dp.LOG_EVERY: ours is timed from its events)


def _ddp(rank: int, world: int, job: Job, out: str) -> None:
    cfg = job.config
    model = job.build_model()
    ddp = DistributedDataParallel(model, bucket_cap_mb=cfg.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    loss_fn = nn.CrossEntropyLoss()
    step, t_warm = 0, 0.0
    for _, idx in replicas.worker_batches(job, rank, world):
        loss = loss_fn(ddp(job.train.x[idx]), job.train.y[idx])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step == WARMUP:
            t_warm = time.perf_counter()
        if step == cfg.max_steps:
            break
    elapsed = time.perf_counter() - t_warm
    dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps({"seconds": elapsed}))


def _ours(rank: int, world: int, job: Job, out: str) -> None:
    sync_dp.process_main(rank, world, job)


SFB_BATCHES = (8, 32, 128, 512)
SFB_STEPS = 20  # the start broadcast (one model, once) is amortised over these


def _sfb_bytes(rank: int, world: int, jobs: list[Job], out: str) -> None:
    """Bytes sent per step by all ranks, with and without sufficient factors."""
    sent = []
    for job in jobs:
        with replicas.open_log(job, rank) as log:
            sync_dp.train_worker(replicas.WorkerContext(job, rank, world, log, time.perf_counter()))
        sent.append(read_result(job).stats["bytes_sent"] if rank == 0 else 0)
        dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps(sent))


def sfb_table(data, tmp: str, world: int) -> dict[str, dict[str, float]]:
    jobs = []
    for batch in SFB_BATCHES:
        for sfb in (False, True):
            cfg = RunConfig(model="mlp", data="synthetic", strategy="sync", workers=world,
                            batch_size=batch, max_steps=SFB_STEPS, epochs=1000.0, sfb=sfb,
                            lr=0.05,
                            allreduce="ring", progress=False, tensorboard=False, test_limit=100,
                            out=f"{tmp}/sfb{world}_{batch}_{int(sfb)}").validate()
            jobs.append(make_job(cfg, "mlp", data))
    spawn(_sfb_bytes, world, (jobs, f"{tmp}/sfb.json"))
    sent = json.loads(Path(f"{tmp}/sfb.json").read_text())
    table = {}
    for i, batch in enumerate(SFB_BATCHES):
        plain, factored = sent[2 * i] / SFB_STEPS, sent[2 * i + 1] / SFB_STEPS
        table[f"N{world}_batch{batch}"] = {"bytes_per_step": plain,
                                           "bytes_per_step_sfb": factored,
                                           "sfb_over_plain": round(factored / plain, 3)}
        print(f"N={world} batch {batch:>4}: {plain / 1e6:.2f} MB/step, with --sfb "
              f"{factored / 1e6:.2f} MB/step", file=sys.stderr)
    return table


def _ours_seconds(job: Job) -> float:
    """From rank 0's train events: wall time from step WARMUP to the last step."""
    events = [e for e in read_events(job.run_dir / "events.jsonl")
              if e["kind"] == "train" and e["rank"] == 0]
    at = {e["step"]: e["wall_s"] for e in events}
    return at[job.config.max_steps] - at[WARMUP]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds")
    args = parser.parse_args()
    steps, rounds = (40, 1) if args.quick else (160, 3)
    data = load_data("synthetic", None, 0)
    results, ratios, targets = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for world in (2, 4):
            samples = (steps - WARMUP) * 32 * world
            runs: dict[str, list[float]] = {"ddp": [], "ring": [], "native": []}
            for r in range(rounds):
                for name in runs:
                    cfg = RunConfig(model="mlp", data="synthetic", strategy="sync",
                                    workers=world, batch_size=32, max_steps=steps,
                                    epochs=1000.0, lr=0.05,
                                    allreduce="native" if name == "ddp" else name,
                                    progress=False, tensorboard=False, test_limit=100,
                                    out=f"{tmp}/{name}{world}_{r}").validate()
                    job = make_job(cfg, "mlp", data)
                    if name == "ddp":
                        spawn(_ddp, world, (job, f"{tmp}/ddp.json"))
                        seconds = json.loads(Path(f"{tmp}/ddp.json").read_text())["seconds"]
                    else:
                        spawn(_ours, world, (job, ""))
                        seconds = _ours_seconds(job)
                    runs[name].append(samples / seconds)
            med = {name: statistics.median(v) for name, v in runs.items()}
            results[f"N{world}"] = {f"{k}_samples_per_s": round(v, 1) for k, v in med.items()}
            for name in ("ring", "native"):
                key = f"{name}_over_ddp_N{world}"
                ratios[key] = round(med[name] / med["ddp"], 3)
                targets[key] = 0.95
            print(f"N={world}: " + "  ".join(f"{k} {v:.0f} samples/s" for k, v in med.items()),
                  file=sys.stderr)
        for world in (2, 4):
            results["sfb_bytes"] = {**results.get("sfb_bytes", {}),
                                    **sfb_table(data, tmp, world)}
    print(json.dumps({"bench": "sync_dp", "results": results, "ratios": ratios,
                      "targets": targets}))


if __name__ == "__main__":
    main()
