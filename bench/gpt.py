"""The GPT on Tiny Shakespeare: tokens/s of our loops against PyTorch's, same model, data,
batches and optimizer (AdamW), measured in this run.

1. single: our single-worker loop (phalanx/parallel/single.py, our functional AdamW)
   against a plain loop a user writes (torch.optim.AdamW), in this process, interleaved,
   one intra-op thread each; medians. Target ours / plain >= 0.97.
2. sync vs DDP, N = 2 and 4 ranks (native allreduce and our ring): tokens/s from step
   WARMUP on, alternating. Target ours / DDP >= 1.0.
3. pipeline (2 stages, GPipe, 4 micro-batches) and tensor parallel (2 ranks) beside them:
   the same global batch, tokens/s of the run (no reference of their own: context).

    python bench/gpt.py [--quick] [--device cpu|cuda]

Sizes: the default GPT (4 blocks, width 128, 4 heads, context 64), batch 16 per rank.
On 2 cores, N ranks share 2 cores: N = 4 measures contention as much as the protocol.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (puts the repo on sys.path)
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import phalanx
from phalanx.config import RunConfig
from phalanx.data import DataOptions, epoch_batches, load_data
from phalanx.entry.api import make_job
from phalanx.errors import ConfigError
from phalanx.metrics import EventLog, read_events
from phalanx.models.loss import TokenCrossEntropy
from phalanx.parallel import replicas, single
from phalanx.parallel.base import Job
from phalanx.runtime.launch import spawn

WARMUP = 10  # steps left out of every timing (a multiple of the loops' LOG_EVERY)
BATCH, CONTEXT, LR = 16, 64, 1e-3


def _config(out: str, device: str, steps: int, **kw) -> RunConfig:
    return RunConfig(model="gpt", data="shakespeare", context=CONTEXT, batch_size=BATCH,
                     rule="adamw", lr=LR, weight_decay=0.1, max_steps=steps,
                     eval_every=10**9, progress=False, tensorboard=False, device=device,
                     out=out, **kw).validate()


def plain_loop(job: Job, steps: int, device: str) -> float:
    """What a PyTorch user writes: the model, torch.optim.AdamW, index batches; tokens/s
    after WARMUP steps."""
    dev = torch.device(device)
    model = job.build_model().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)
    loss_fn = TokenCrossEntropy()
    x_all, y_all = job.train.x.to(dev), job.train.y.to(dev)
    done, t0 = 0, 0.0
    for idx in epoch_batches(job.shard(0, 1), BATCH, 0, job.config.seed):
        idx = idx.to(dev)
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x_all[idx]), y_all[idx]).backward()
        opt.step()
        done += 1
        if done == WARMUP:
            _sync(dev)
            t0 = time.perf_counter()
        if done == steps:
            break
    _sync(dev)
    return (steps - WARMUP) * BATCH * CONTEXT / (time.perf_counter() - t0)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()  # sync point: the GPU's queued work, before the clock


def ours_single(job: Job, steps: int) -> float:
    with EventLog(job.run_dir / "events.jsonl") as log:
        single.run(job, log)
    return _steady(job) * CONTEXT


def _steady(job: Job, rank: int | None = None) -> float:
    """Samples/s from the train events of ``rank`` (default: the lowest that logged) between
    step WARMUP and the last; x the ranks that draw distinct batches is the caller's."""
    events = [e for e in read_events(job.run_dir / "events.jsonl") if e["kind"] == "train"]
    ranks = sorted({e["rank"] for e in events})
    pick = rank if rank is not None else ranks[0]
    at = {e["step"]: (e["wall_s"], e["samples"]) for e in events if e["rank"] == pick}
    last = max(at)
    (t0, s0), (t1, s1) = at[WARMUP], at[last]
    return (s1 - s0) / (t1 - t0)


def _ddp(rank: int, world: int, job: Job, out: str) -> None:
    cfg = job.config
    dev = torch.device("cpu" if cfg.device == "cpu"
                       else f"cuda:{rank % max(1, torch.cuda.device_count())}")
    model = job.build_model().to(dev)
    ddp = DistributedDataParallel(model, bucket_cap_mb=cfg.bucket_mb)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    loss_fn = TokenCrossEntropy()
    step, t0 = 0, 0.0
    for _, idx in replicas.worker_batches(job, rank, world):
        loss_fn(ddp(job.train.x[idx].to(dev)), job.train.y[idx].to(dev)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step == WARMUP:
            _sync(dev)
            t0 = time.perf_counter()
        if step == cfg.max_steps:
            break
    _sync(dev)
    elapsed = time.perf_counter() - t0
    dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps({"seconds": elapsed}))


def bench_single(tmp: str, device: str, steps: int, repeats: int) -> tuple[dict, dict]:
    cfg = _config(f"{tmp}/single", device, steps, threads=1)
    job = make_job(cfg)
    torch.set_num_threads(1)
    plain_loop(job, WARMUP + 2, device)  # warm-up: allocator, kernels
    mine, ref = [], []
    for r in range(repeats):
        ref.append(plain_loop(job, steps, device))
        job.run_dir = Path(f"{tmp}/single{r}")
        job.run_dir.mkdir(parents=True, exist_ok=True)
        mine.append(ours_single(job, steps))
    m, p = statistics.median(mine), statistics.median(ref)
    print(f"single: ours {m:.0f} tokens/s, plain PyTorch {p:.0f} tokens/s", file=sys.stderr)
    return ({"ours_tokens_per_s": round(m), "plain_pytorch_tokens_per_s": round(p),
             "ours_all": [round(v) for v in mine], "plain_all": [round(v) for v in ref]},
            {"single_over_plain": round(m / p, 3)})


def bench_sync(tmp: str, device: str, steps: int, rounds: int, worlds) -> tuple[dict, dict]:
    data = load_data("shakespeare", options=DataOptions(context=CONTEXT))
    results, ratios = {}, {}
    for world in worlds:
        runs: dict[str, list[float]] = {"ddp": [], "native": [], "ring": []}
        for r in range(rounds):
            for name in runs:
                cfg = _config(f"{tmp}/{name}{world}_{r}", device, steps, strategy="sync",
                              workers=world, worker_threads=1,
                              allreduce="native" if name == "ddp" else name)
                job = make_job(cfg, None, data)
                if name == "ddp":
                    spawn(_ddp, world, (job, f"{tmp}/ddp.json"))
                    seconds = json.loads(Path(f"{tmp}/ddp.json").read_text())["seconds"]
                    runs[name].append((steps - WARMUP) * BATCH * world * CONTEXT / seconds)
                else:
                    phalanx.train(config=cfg, data=data)
                    runs[name].append(_steady(job) * world * CONTEXT)
        med = {k: statistics.median(v) for k, v in runs.items()}
        results[f"sync_N{world}"] = {f"{k}_tokens_per_s": round(v) for k, v in med.items()}
        for name in ("native", "ring"):
            ratios[f"sync_{name}_over_ddp_N{world}"] = round(med[name] / med["ddp"], 3)
        print(f"N={world}: " + "  ".join(f"{k} {v:.0f} tokens/s" for k, v in med.items()),
              file=sys.stderr)
    return results, ratios


def bench_stages(tmp: str, device: str, steps: int) -> dict:
    data = load_data("shakespeare", options=DataOptions(context=CONTEXT))
    out = {}
    for name, kw, rank in (("pipeline", {"strategy": "pipeline", "stages": 2,
                                         "microbatches": 4}, 1),
                           ("tensor", {"strategy": "tensor", "workers": 2}, 0)):
        cfg = _config(f"{tmp}/{name}", device, steps, worker_threads=1, **kw)
        job = make_job(cfg, None, data)
        try:
            phalanx.train(config=cfg, data=data)
        except ConfigError as e:  # tensor's 2 ranks on one GPU: refused (placement.py)
            out[f"{name}_refused"] = str(e)
            print(f"{name}: refused: {e}", file=sys.stderr)
            continue
        out[f"{name}_tokens_per_s"] = round(_steady(job, rank) * CONTEXT)
        print(f"{name}: {out[f'{name}_tokens_per_s']} tokens/s", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps and rounds (< 1 min)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        _common.emit("gpt", {"skipped": "CUDA not available"}, {}, {})
        return
    steps, repeats, rounds = (30, 2, 1) if args.quick else (80, 5, 3)
    worlds = (2,) if args.quick else (2, 4)
    results, ratios, targets = {}, {}, {"single_over_plain": 0.97}
    with tempfile.TemporaryDirectory() as tmp:
        results["single"], r = bench_single(tmp, args.device, steps, repeats)
        ratios.update(r)
        sync, r = bench_sync(tmp, args.device, steps, rounds, worlds)
        results.update(sync)
        ratios.update(r)
        targets.update({k: 1.0 for k in r})
        results["stages"] = bench_stages(tmp, args.device, steps)
    results.update({"model": "gpt 4x128, 4 heads", "context": CONTEXT, "batch_per_rank": BATCH,
                    "device": args.device, "steps": steps, "warmup_steps": WARMUP})
    _common.emit("gpt", results, ratios, targets)


if __name__ == "__main__":
    main()
