"""Single-worker loop vs a plain hand-written PyTorch loop, same model, data and steps.

Ratio = our samples/s over the plain loop's (target >= 0.95). Both run in this process,
interleaved, several repeats; medians reported.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (puts the repo on sys.path)
import torch
from torch import nn

from phalanx.config import RunConfig
from phalanx.data import epoch_batches
from phalanx.entry.api import make_job
from phalanx.metrics import EventLog
from phalanx.parallel import single


def plain_loop(job, steps: int) -> float:
    """What a user writes by hand: model, torch.optim.SGD(momentum), index batches."""
    cfg = job.config
    model = job.build_model()
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    shard = job.shard(0, 1)
    x_all, y_all = job.train.x, job.train.y
    t0 = time.perf_counter()
    done = 0
    for idx in epoch_batches(shard, cfg.batch_size, 0, cfg.seed):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
        opt.step()
        done += 1
        if done == steps:
            break
    return done * cfg.batch_size / (time.perf_counter() - t0)


def ours(job, steps: int) -> float:
    t0 = time.perf_counter()
    with EventLog(job.run_dir / "events.jsonl") as log:
        outcome = single.run(job, log)
    assert outcome.steps == steps
    return outcome.train_samples / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer steps and repeats (< 1 min)")
    ap.add_argument("--model", default="lenet5")
    ap.add_argument("--data", default="fashion-mnist")
    args = ap.parse_args()
    torch.set_num_threads(1)
    steps, repeats = (150, 3) if args.quick else (400, 5)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig(model=args.model, data=args.data, rule="momentum", lr=0.01, batch_size=64,
                        max_steps=steps, eval_every=10**9, progress=False, tensorboard=False,
                        out=tmp).validate()
        try:
            job = make_job(cfg)
        except Exception:  # noqa: BLE001 - no Fashion-MNIST on this machine: synthetic
            cfg.data = "synthetic"
            job = make_job(cfg)
        Path(tmp).mkdir(exist_ok=True)
        plain_loop(job, 20)  # warm-up: allocator, kernels
        mine, ref = [], []
        for _ in range(repeats):
            ref.append(plain_loop(job, steps))
            mine.append(ours(job, steps))
    m_ours, m_ref = _common.median(mine), _common.median(ref)
    _common.emit(
        "single",
        {"model": cfg.model, "data": cfg.data, "steps": steps, "batch_size": cfg.batch_size,
         "threads": 1, "ours_samples_per_s": m_ours, "plain_pytorch_samples_per_s": m_ref,
         "ours_all": mine, "plain_all": ref},
        {"ours_over_plain": m_ours / m_ref},
        {"ours_over_plain": 0.95},
    )


if __name__ == "__main__":
    main()
