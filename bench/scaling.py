"""Scaling with the number of worker processes: steady-state samples/s of every data-parallel
strategy at N = 1, 2, 4, 8, ... up to the cores, against the single-worker loop and
PyTorch DDP (the reference, same N), LeNet-5, batch 64 per worker, 1 thread per worker.

    python bench/scaling.py [--device cpu|cuda] [--max-workers N] [--worker-counts 8,15]
                            [--quick]

Measured: single, sync ring, sync native, DDP, average (k = 8), ASP and SSP with 1 and 2
shards, Hogwild!. Throughput is steady state: from each rank's train events (per-rank
samples, docs/events.md) between step WARMUP and its last step, summed over the ranks, so
process start-up and the first steps are excluded (DDP: timed the same way inside its
processes). Efficiency = samples/s / (N x single).

Targets (issue 11, a machine with >= 16 cores): sync ring and native >= 1.0 x DDP at every
N; efficiency >= 0.8 at N = 8 for sync (ring, native) and ASP with 2 shards. Targets at an
N the machine cannot run are listed under ``not_measured``, never dropped silently. On 2
cores only ``--quick`` (N = 2) means anything: N workers (+ shards) share two cores.

A measurement that fails (a run that raises: a dead worker, a diverged loss) does not stop
the others: it is printed, listed under ``results.failed`` as ``NAME_NN: its one-line
reason``, its ratios are absent (a target that needs it is not met) and the benchmark
exits 1 after its JSON line (the last line, as always).

Learning rate: SGD 0.05 (single's default), except Hogwild!, whose N workers race on one
copy of the weights: a worker's gradient is computed on weights that the other N - 1 have
written to since it read them (staleness ~ N - 1), so it takes lr 0.05 / max(1, N - 1), the
staleness-aware step of ``--staleness-lr`` (Zhang et al. 2016: lr / staleness). N = 2 keeps
0.05. Measured on the first GPU check's 16 cores (2026-11-27): 15 writers at lr 0.05 diverged
at step 10 (loss nan); 8 did not. The rate does not depend on lr: only the run must last.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (puts the repo on sys.path)
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from phalanx.config import RunConfig
from phalanx.data import load_data
from phalanx.entry.api import make_job, train
from phalanx.metrics import read_events
from phalanx.parallel import replicas
from phalanx.parallel.base import Job
from phalanx.runtime.launch import spawn
from phalanx.runtime.placement import cores

WARMUP = 10  # steps not timed (a multiple of the strategies' LOG_EVERY)
BATCH = 64
LR = 0.05  # SGD, every strategy but Hogwild! (see hogwild_lr)
# name -> RunConfig options; N is --workers
STRATEGIES = {
    "sync_ring": {"strategy": "sync", "allreduce": "ring"},
    "sync_native": {"strategy": "sync", "allreduce": "native"},
    "average_k8": {"strategy": "average", "period": 8},
    "asp_1shard": {"strategy": "asp", "servers": 1},
    "asp_2shards": {"strategy": "asp", "servers": 2},
    "ssp_1shard": {"strategy": "ssp", "servers": 1},
    "ssp_2shards": {"strategy": "ssp", "servers": 2},
    "hogwild": {"strategy": "hogwild"},
}


def steady_rate(run_dir: Path) -> float:
    """Samples/s summed over ranks, each from its train events at step >= WARMUP."""
    by_rank: dict[int, list[dict]] = {}
    for e in read_events(run_dir / "events.jsonl"):
        if e["kind"] == "train" and e["step"] >= WARMUP:
            by_rank.setdefault(e["rank"], []).append(e)
    total = 0.0
    for events in by_rank.values():
        first, last = events[0], events[-1]
        if last["wall_s"] > first["wall_s"]:
            total += (last["samples"] - first["samples"]) / (last["wall_s"] - first["wall_s"])
    return total


def _ddp(rank: int, world: int, job: Job, device: str, out: str) -> None:
    torch.set_num_threads(1)
    cfg = job.config
    dev = torch.device(device)
    model = job.build_model().to(dev)
    ddp = DistributedDataParallel(model, device_ids=[dev] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    loss_fn = nn.CrossEntropyLoss()
    x_all, y_all = job.train.x.to(dev), job.train.y.to(dev)
    step, t_warm = 0, 0.0
    for _, idx in replicas.worker_batches(job, rank, world):
        idx = idx.to(dev)
        loss = loss_fn(ddp(x_all[idx]), y_all[idx])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step == WARMUP:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t_warm = time.perf_counter()
        if step == cfg.max_steps:
            break
    if dev.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t_warm
    dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps({"seconds": elapsed}))


def hogwild_lr(n: int) -> float:
    """Hogwild!'s lr with ``n`` racing writers: LR over the staleness, n - 1 (the module
    doc)."""
    return LR / max(1, n - 1)


def config(tmp: str, name: str, n: int, steps: int, device: str, **options) -> RunConfig:
    lr = hogwild_lr(n) if options.get("strategy") == "hogwild" else LR
    return RunConfig(model="lenet5", data="synthetic", workers=n, batch_size=BATCH, lr=lr,
                     rule="sgd", max_steps=steps, epochs=1000.0, eval_every=10**9,
                     progress=False, tensorboard=False, test_limit=100, worker_threads=1,
                     threads=1, device=device, out=f"{tmp}/{name}_N{n}",
                     **options).validate()


def measure(name: str, n: int, steps: int, device: str, data) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        if name == "ddp":
            cfg = config(tmp, name, n, steps, device, strategy="sync")
            job = make_job(cfg, "lenet5", data)
            spawn(_ddp, n, (job, device, f"{tmp}/ddp.json"))
            seconds = json.loads(Path(f"{tmp}/ddp.json").read_text())["seconds"]
            return (steps - WARMUP) * BATCH * n / seconds
        opts = {"strategy": "single"} if name == "single" else STRATEGIES[name]
        cfg = config(tmp, name, n, steps, device, **opts)
        train("lenet5", data, config=cfg)
        return steady_rate(Path(cfg.out))


def worker_counts(text: str, top: int, ap: argparse.ArgumentParser) -> list[int]:
    """``--worker-counts 8,15``: distinct N in 1..top, ascending (one line otherwise)."""
    try:
        ns = sorted({int(v) for v in text.split(",")})
    except ValueError:
        ap.error(f"--worker-counts: {text!r} is not a comma list of whole numbers")
    if not ns or ns[0] < 1 or ns[-1] > top:
        ap.error(f"--worker-counts: {text!r}: each N must be in 1..{top} (--max-workers, "
                 "or the cores)")
    return ns


def one_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def attempt(name: str, n: int, steps: int, device: str, data,
            failed: dict[str, str]) -> float | None:
    """``measure``, or None with the failure's one line in ``failed`` (the others go on)."""
    try:
        return measure(name, n, steps, device, data)
    except Exception as e:  # a dead worker, a diverged loss: reported, never hidden
        failed[f"{name}_N{n}"] = one_line(e)
        print(f"N={n} {name}: FAILED: {failed[f'{name}_N{n}']}", flush=True)
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--max-workers", type=int, default=0, help="largest N (default: cores)")
    ap.add_argument("--worker-counts", default="",
                    help="comma list of the N to measure, each <= --max-workers (default: "
                         "1, 2, 4, ... up to --max-workers): e.g. 8,15 on 16 cores")
    ap.add_argument("--quick", action="store_true", help="N = 2 only, fewer steps")
    args = ap.parse_args(argv)
    if args.worker_counts and args.quick:
        ap.error("--worker-counts: --quick measures N = 2 only; drop one of them")
    torch.set_num_threads(1)
    n_cores = cores()
    if args.device == "cuda" and not torch.cuda.is_available():
        _common.emit("scaling", {"device": "cuda", "note": "skipped: CUDA not available"},
                     {}, {})
        return 0
    top = args.max_workers or n_cores
    ns = [1]
    while ns[-1] * 2 <= top:
        ns.append(ns[-1] * 2)
    if args.worker_counts:
        ns = worker_counts(args.worker_counts, top, ap)
    if args.quick:
        ns = [2]  # one N against the single loop: under a minute on two cores
    steps = 60 if args.quick else 160
    data = load_data("synthetic", None, 0)
    failed: dict[str, str] = {}
    # the reference is measured before, between and after the others (median): one
    # measurement of a one-second run on a shared machine can be off by a factor
    singles = [attempt("single", 1, steps, args.device, data, failed)]
    rates: dict[str, dict[str, float]] = {}
    for n in ns:
        for i, name in enumerate(("ddp", *STRATEGIES)):
            rate = attempt(name, n, steps, args.device, data, failed)
            if rate is not None:
                rates.setdefault(name, {})[f"N{n}"] = round(rate, 1)
                print(f"N={n} {name}: {rate:.0f} samples/s", flush=True)
            if i == len(STRATEGIES) // 2:
                singles.append(attempt("single", 1, steps, args.device, data, failed))
    singles.append(attempt("single", 1, steps, args.device, data, failed))
    measured = [v for v in singles if v is not None]
    single = _common.median(measured) if measured else None
    ratios: dict[str, float] = {}
    for name, by_n in rates.items():
        for key, rate in by_n.items():
            if single:
                ratios[f"{name}_efficiency_{key}"] = round(rate / (int(key[1:]) * single), 3)
    for n in ns:
        for name in ("sync_ring", "sync_native"):
            ours, ddp = rates.get(name, {}).get(f"N{n}"), rates.get("ddp", {}).get(f"N{n}")
            if ours is not None and ddp:
                ratios[f"{name}_over_ddp_N{n}"] = round(ours / ddp, 3)
    targets: dict[str, float] = {}
    for n in ns:
        targets[f"sync_ring_over_ddp_N{n}"] = targets[f"sync_native_over_ddp_N{n}"] = 1.0
    wanted_at_8 = ("sync_ring", "sync_native", "asp_2shards")
    not_measured = []
    for name in wanted_at_8:
        key = f"{name}_efficiency_N8"
        if 8 in ns:
            targets[key] = 0.8
        else:
            not_measured.append(f"{key} >= 0.8 (needs --max-workers 8 and >= 8 cores)")
    # a target whose measurement failed stays in targets (not met) and says why here
    not_measured += [f"{key} (a measurement failed: {', '.join(sorted(failed))})"
                     for key in targets if key not in ratios]
    note = ("2 cores: N workers (+ shards) share two cores, so efficiency here measures "
            "contention; the many-core targets need a many-core machine"
            if n_cores < 8 else "")
    if failed:
        note = (f"{len(failed)} measurement(s) FAILED: {', '.join(failed)}"
                + (f"; {note}" if note else ""))
    _common.emit("scaling", {"device": args.device, "cores": n_cores, "workers": ns,
                             "steps": steps, "warmup_steps": WARMUP, "batch": BATCH,
                             "model": "lenet5", "lr": LR,
                             "hogwild_lr": {f"N{n}": hogwild_lr(n) for n in ns},
                             "single_samples_per_s": None if single is None else round(
                                 single, 1),
                             "single_all": [None if v is None else round(v, 1)
                                            for v in singles],
                             "samples_per_s": rates, "failed": failed,
                             "not_measured": not_measured, "note": note},
                 ratios, targets)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
