"""Single-worker baseline: the loop every other strategy is compared against."""

from __future__ import annotations

import torch
from torch import nn

from phalanx.data import epoch_batches
from phalanx.errors import ConfigError
from phalanx.metrics import EventLog
from phalanx.parallel.base import GradAccumulator, Job, Outcome, detached
from phalanx.parallel.divergence import check_loss
from phalanx.parallel.spec import StrategySpec
from phalanx.parallel.worker import StepReporter, WorkerKit
from phalanx.rules import apply_updates, make_rule, state_tensors
from phalanx.runtime.checkpoint import save_checkpoint
from phalanx.runtime.placement import DeviceSupport


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
    kit = WorkerKit.of(cfg, 0)
    # the whole training set moves to the device once; batches are then indexed there
    x_all, y_all = job.train.x.to(device), job.train.y.to(device)
    report = StepReporter(cfg, log, total, "single", shows_progress=True, evaluates=True)

    step, samples, epoch = 0, 0, 0
    accumulator = GradAccumulator(cfg.grad_accum)
    while step < total:
        for idx in epoch_batches(shard, cfg.batch_size, epoch, cfg.seed):
            idx = idx.to(device)
            x, y = x_all[idx], y_all[idx]
            if kit.aug is not None:
                x = kit.aug(x, kit.gen)
            out = model(x)
            loss = kit.loss_fn(out, y)
            g = torch.autograd.grad(loss, params)
            samples += len(idx)
            grads = accumulator.add(g)
            if grads is None:
                continue  # accumulate; the optimizer steps on the last micro-batch
            updates, state = rule.update(grads, state, weights)
            apply_updates(weights, updates)
            step += 1
            if report.wants_train(step):
                check_loss(cfg, loss.item(), step)  # NaN / inf: stop now, in one line
                report.step(step, epoch, loss, out, y, samples)
            report.maybe_eval(model, job.test, step, epoch, samples, epoch_ended=False)
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                _checkpoint(job, model, state, step)
            if step >= total:
                break
        epoch += 1
        report.maybe_eval(model, job.test, step, epoch, samples, epoch_ended=True)
    report.close()
    _checkpoint(job, model, state, step)
    return Outcome(model.cpu(), samples, step)


def _checkpoint(job: Job, model: nn.Module, state, step: int) -> None:
    save_checkpoint(job.run_dir / "checkpoint.pt", {
        "step": step,
        "model": {k: v.cpu() for k, v in model.state_dict().items()},
        "rule_state": [t.cpu() for t in state_tensors(state)],
    })


def check(cfg) -> None:
    if cfg.slow_workers:
        raise ConfigError("--slow-workers: --strategy single has no other worker to wait for "
                          "(a straggler slows a group; choose a parallel strategy, e.g. sync)")


SPEC = StrategySpec(
    "single", "one worker: the baseline every strategy is compared against", run,
    check=check, device=DeviceSupport(nccl=False), fixed_workers=1)
