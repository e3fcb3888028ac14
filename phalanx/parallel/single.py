"""Single-worker baseline: the loop every other strategy is compared against."""

from __future__ import annotations

import time

import torch
from torch import nn

from phalanx.data import epoch_batches
from phalanx.metrics import EventLog, Progress
from phalanx.parallel.base import (
    GradAccumulator,
    Job,
    Outcome,
    augmenter,
    detached,
    evaluate,
)
from phalanx.parallel.divergence import check_loss
from phalanx.parallel.spec import StrategySpec
from phalanx.rules import apply_updates, make_rule, state_tensors
from phalanx.runtime.checkpoint import save_checkpoint
from phalanx.runtime.placement import DeviceSupport

LOG_EVERY = 10  # steps between "train" events; evaluation is logged per epoch


def run(job: Job, log: EventLog) -> Outcome:
    cfg = job.config
    device = torch.device(cfg.device)
    model = job.build_model().to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    weights = detached(params)
    shard = job.shard(0, 1)
    total = job.planned_steps(len(shard))
    rule = make_rule(cfg, total)
    state = rule.init(weights)
    aug = augmenter(cfg)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    loss_fn = nn.CrossEntropyLoss()
    # the whole training set moves to the device once; batches are then indexed there
    x_all, y_all = job.train.x.to(device), job.train.y.to(device)
    progress = Progress(total, "single", enabled=cfg.progress)

    step, samples, epoch = 0, 0, 0
    accumulator = GradAccumulator(cfg.grad_accum)
    t0 = time.perf_counter()
    while step < total:
        for idx in epoch_batches(shard, cfg.batch_size, epoch, cfg.seed):
            idx = idx.to(device)
            x, y = x_all[idx], y_all[idx]
            if aug is not None:
                x = aug(x, gen)
            out = model(x)
            loss = loss_fn(out, y)
            g = torch.autograd.grad(loss, params)
            samples += len(idx)
            grads = accumulator.add(g)
            if grads is None:
                continue  # accumulate; the optimizer steps on the last micro-batch
            updates, state = rule.update(grads, state, weights)
            apply_updates(weights, updates)
            step += 1
            if step % LOG_EVERY == 0 or step == total:
                # .item() is a sync point on GPU; only paid every LOG_EVERY steps
                acc = (out.argmax(1) == y).float().mean().item()
                check_loss(cfg, loss.item(), step)  # NaN / inf: stop now, in one line
                log.log("train", step=step, epoch=epoch, loss=loss.item(), accuracy=acc,
                        samples=samples, wall_s=time.perf_counter() - t0)
                progress.update(step, loss=loss.item())
            if cfg.eval_every and step % cfg.eval_every == 0:
                _eval(job, model, log, step, epoch, samples, t0)
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                _checkpoint(job, model, state, step)
            if step >= total:
                break
        epoch += 1
        if not cfg.eval_every:
            _eval(job, model, log, step, epoch, samples, t0)
    progress.close()
    _checkpoint(job, model, state, step)
    return Outcome(model.cpu(), samples, step)


def _eval(job: Job, model: nn.Module, log: EventLog, step: int, epoch: int, samples: int,
          t0: float) -> None:
    loss, acc = evaluate(model, job.test)
    log.log("eval", step=step, epoch=epoch, samples=samples, test_loss=loss, test_accuracy=acc,
            wall_s=time.perf_counter() - t0)


def _checkpoint(job: Job, model: nn.Module, state, step: int) -> None:
    save_checkpoint(job.run_dir / "checkpoint.pt", {
        "step": step,
        "model": {k: v.cpu() for k, v in model.state_dict().items()},
        "rule_state": [t.cpu() for t in state_tensors(state)],
    })


SPEC = StrategySpec(
    "single", "one worker: the baseline every strategy is compared against", run,
    device=DeviceSupport(nccl=False), fixed_workers=1)
