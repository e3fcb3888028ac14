"""Single-worker baseline: the loop every other strategy is compared against."""

from __future__ import annotations

import torch

from phalanx.errors import ConfigError
from phalanx.metrics import EventLog
from phalanx.parallel.base import Job, Outcome, detached
from phalanx.parallel.device_data import DeviceData, train_bytes
from phalanx.parallel.dp_checkpoint import save_snapshot
from phalanx.parallel.loop import Batch, Hooks, Loop, Micro, Position, backward, batch_stream
from phalanx.parallel.precision import precision_of
from phalanx.parallel.spec import StrategySpec
from phalanx.parallel.worker import StepReporter, WorkerKit
from phalanx.rules import apply_updates, make_rule, state_tensors, update_owned
from phalanx.rules.sparse import TableRule, sparse_table
from phalanx.runtime.placement import DeviceSupport, Placement, plan_for

DEVICE = DeviceSupport(nccl=False)  # one process: no collectives


class _SingleHooks(Hooks):
    """Forward, backward, the rule's update: nothing to exchange."""

    def __init__(self, job: Job, place: Placement, log: EventLog) -> None:
        cfg = job.config
        self.job, self.log, self.model = job, log, job.build_model().to(place.torch_device)
        self.model.train()
        self.test = job.test
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.weights = detached(self.params)
        self.total = job.planned_steps(len(job.shard(0, 1)))
        self.rule = make_rule(cfg, self.total)
        # a sparse table (the click model's): only the rows a batch touched are updated
        table = sparse_table(self.model, self.params)
        self.table_rule = TableRule(self.rule, table) if table is not None else None
        self.state = (self.table_rule.init(self.weights) if self.table_rule is not None
                      else self.rule.init(self.weights))
        self.kit = WorkerKit.of(cfg, 0)
        self.precision = precision_of(cfg)  # --precision: the forward's autocast
        self.data = DeviceData(job.train, place.torch_device, place.data_on_device,
                               self.kit.aug is not None)

    def fetch(self, idx: torch.Tensor, first: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data.batch(idx, self.kit.aug, self.kit.gen)

    def forward_backward(self, batch: Batch, scale: float, last: bool) -> Micro:
        return backward(self.model, self.kit.loss_fn, batch, scale, self.precision)

    def apply_update(self, step: int) -> dict:
        grads = [p.grad for p in self.params]
        if self.table_rule is not None:
            self.state = self.table_rule.step(grads, self.state, self.weights)
        else:
            # the gradients are this step's own (cleared below): updated in place
            updates, self.state = update_owned(self.rule, grads, self.state, self.weights)
            apply_updates(self.weights, updates)
        for p in self.params:
            p.grad = None
        return {}

    def checkpoint(self, pos: Position, final: bool) -> None:
        save_snapshot(self.job, self.model.state_dict(), pos, state_tensors(self.state))
        self.log.log("checkpoint", step=pos.step, epoch=pos.epoch)


def run(job: Job, log: EventLog) -> Outcome:
    cfg = job.config
    hooks = _SingleHooks(job, plan_for(cfg, 0, 1, DEVICE, data_bytes=train_bytes(job)), log)
    report = StepReporter(cfg, log, hooks.total, "single", shows_progress=True, evaluates=True)
    batches = batch_stream(job.shard(0, 1), cfg.batch_size, cfg.seed)
    pos = Loop(cfg, report, hooks, batches, hooks.total, straggler=hooks.kit.straggler).run()
    return Outcome(hooks.model.cpu(), pos.samples, pos.step)


def check(cfg) -> None:
    if cfg.slow_workers:
        raise ConfigError("--slow-workers: --strategy single has no other worker to wait for "
                          "(a straggler slows a group; choose a parallel strategy, e.g. sync)")


SPEC = StrategySpec(
    name="single", summary="one worker: the baseline every strategy is compared against",
    run=run, check=check, device=DEVICE, fixed_workers=1,
    supports=frozenset({"sparse_grads", "bf16"}),
    unused={"worker_threads": "it trains in the driver process: --threads sets its threads",
            "backend": "one process has no collectives",
            "memory_limit": "it trains in the driver process, where a limit would outlive "
                            "the run (a parallel strategy's ranks take it)"})
