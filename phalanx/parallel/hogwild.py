"""Hogwild! (Niu et al. 2011): N processes run SGD on ONE model in shared memory, no locks.

The driver builds the model and moves its tensors to shared memory (``share_memory_``);
every worker process maps the same storage, computes gradients on its own shard while
the others keep writing, and adds its update in place. Reads may see a half-applied
update of another worker: Hogwild! accepts that (it converges when updates rarely collide).

``--lock`` is the variant to compare against: a worker copies the weights under a lock
(a consistent snapshot), computes its gradient on the copy without holding it, and takes
the lock again to apply its update atomically.

Shared memory means one machine: this strategy has no ``process_main`` for torchrun.
"""

from __future__ import annotations

import copy
import math
import time

import torch
import torch.distributed as dist
from torch import nn

from phalanx.errors import ConfigError, PhalanxError
from phalanx.metrics import EventLog
from phalanx.parallel.base import (
    Job,
    Outcome,
    detached,
    write_result,
)
from phalanx.parallel.device_data import DeviceData, train_bytes
from phalanx.parallel.dp_checkpoint import save_snapshot
from phalanx.parallel.loop import Batch, Hooks, Loop, Micro, Position, backward, batch_stream
from phalanx.parallel.spec import StrategySpec
from phalanx.parallel.stats import HogwildStats
from phalanx.parallel.worker import StepReporter, WorkerKit
from phalanx.rules import apply_updates, make_rule, state_tensors
from phalanx.runtime.launch import spawn
from phalanx.runtime.placement import (
    DeviceSupport,
    Placement,
    plan_for,
    setup_rank,
    spawn_backend,
)
from phalanx.runtime.supervise import process_context

# every worker updates one model: on one GPU (CUDA IPC) or in shared host memory; no traffic
DEVICE = DeviceSupport(nccl=False, one_device=True)


def world_size(cfg) -> int:
    return cfg.workers


def run(job: Job, log: EventLog) -> Outcome:
    cfg = job.config
    shard = min(len(job.shard(r, cfg.workers)) for r in range(cfg.workers))
    if cfg.batch_size > shard:
        raise ConfigError(f"--batch-size: {cfg.batch_size} exceeds a worker's {shard} samples")
    backend = spawn_backend(cfg, cfg.workers, DEVICE)  # checks --device/--backend before anything
    # one model for every worker: in shared host memory, or on the GPU where the workers
    # map it through CUDA IPC handles (torch.multiprocessing sends a CUDA tensor as a
    # handle to the same memory; this process must keep it alive until they finish)
    device = plan_for(cfg, 0, cfg.workers, DEVICE).torch_device
    model = job.build_model().to(device)
    model.train()
    if device.type == "cpu":
        model.share_memory()  # parameters and buffers now live in shared memory
    # per worker: samples seen, updates applied (written by the worker, read here)
    counters = torch.zeros(cfg.workers, 2, dtype=torch.int64).share_memory_()
    # per worker: wall-clock start and end of its training loop (after process start-up)
    clocks = torch.zeros(cfg.workers, 2, dtype=torch.float64).share_memory_()
    # worker 0's checksum of the final shared weights, as the workers see them
    seen = torch.zeros(1, dtype=torch.float64).share_memory_()
    lock = process_context().Lock() if cfg.lock else None
    t0 = time.perf_counter()
    # the gloo group that spawn sets up only holds the final barrier: the model itself is
    # the shared state
    spawn(_worker, cfg.workers, (job, model, counters, clocks, lock, seen), backend=backend,
          name=lambda rank: f"worker {rank}")
    wall = time.perf_counter() - t0
    mine = _checksum(model)
    if not math.isclose(mine, float(seen[0]), rel_tol=1e-9, abs_tol=1e-9):
        # never evaluate a model the workers did not train (it would score ~chance)
        raise PhalanxError(f"hogwild: the model in the driver (checksum {mine:.6g}) is not "
                           f"the one the workers trained ({float(seen[0]):.6g}): the "
                           "shared memory was not shared")
    samples, updates = (int(v) for v in counters.sum(0))
    train_s = float(clocks[:, 1].max() - clocks[:, 0].min())
    stats = HogwildStats(  # no messages (bytes_sent 0): workers write the shared tensors
        updates=updates, lock=cfg.lock,
        shared_bytes_written=updates * sum(p.numel() * p.element_size()
                                           for p in model.parameters()),
        train_wall_s=train_s, train_samples_per_s=samples / train_s if train_s > 0 else 0.0,
        launch_wall_s=wall)
    write_result(job, model.state_dict(), train_samples=samples, steps=updates, stats=stats)
    return Outcome(model.cpu(), samples, updates, stats)


def _checksum(model: nn.Module) -> float:
    with torch.no_grad():
        return float(sum(p.detach().double().sum() for p in model.parameters()))


class _HogwildHooks(Hooks):
    """One worker: its gradient on the shared weights (or, with ``--lock``, on a snapshot
    copied under the lock), its update written into them in place."""

    def __init__(self, job: Job, rank: int, world: int, model: nn.Module, place: Placement,
                 counters: torch.Tensor, lock) -> None:
        cfg = self.cfg = job.config
        self.job, self.rank, self.counters, self.lock = job, rank, counters, lock
        self.model, self.test = model, job.test  # evaluated: the shared model
        self.shared_w = detached([p for p in model.parameters() if p.requires_grad])
        # with --lock the gradient is computed on a private snapshot of the weights
        self.local = copy.deepcopy(model) if lock is not None else model
        self.params = [p for p in self.local.parameters() if p.requires_grad]
        self.local_w = detached(self.params)
        self.total = job.planned_steps(min(len(job.shard(r, world)) for r in range(world)))
        self.rule = make_rule(cfg, self.total)
        self.state = self.rule.init(self.shared_w)  # each worker keeps its own optimizer state
        self.kit = WorkerKit.of(cfg, rank)
        self.data = DeviceData(job.train, place.torch_device, place.data_on_device,
                               self.kit.aug is not None)
        self.samples = 0

    def fetch(self, idx: torch.Tensor, first: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if first and self.lock is not None:
            with self.lock:  # consistent read: no update is half-applied in the copy
                torch._foreach_copy_(self.local_w, self.shared_w)
        return self.data.batch(idx, self.kit.aug, self.kit.gen)

    def forward_backward(self, batch: Batch, scale: float, last: bool) -> Micro:
        self.samples += len(batch[1])
        return backward(self.local, self.kit.loss_fn, batch, scale)

    def apply_update(self, step: int) -> dict:
        grads = [p.grad for p in self.params]
        if self.lock is not None:
            with self.lock:  # atomic write: the update lands whole
                self._write(grads)
        else:
            self._write(grads)  # Hogwild!: read-modify-write of shared memory, no lock
        for p in self.params:
            p.grad = None
        self.counters[self.rank, 0] = self.samples
        self.counters[self.rank, 1] = step
        return {}

    def _write(self, grads: list[torch.Tensor]) -> None:
        updates, self.state = self.rule.update(grads, self.state, self.shared_w)
        apply_updates(self.shared_w, updates)

    def evaluate(self, report: StepReporter, step: int, epoch: int, samples: int) -> None:
        if report.evaluates:
            # evaluated while the other workers keep writing: a snapshot taken without a
            # lock; samples: every worker's so far
            report.evaluate(copy.deepcopy(self.model), self.test, step, epoch,
                            int(self.counters[:, 0].sum()))

    def checkpoint(self, pos: Position, final: bool) -> None:
        every = self.cfg.checkpoint_every
        if self.rank == 0 and every and pos.step % every == 0:
            # a lock-free snapshot of the shared model (rank 0's own rule state)
            save_snapshot(self.job, self.model.state_dict(), pos, state_tensors(self.state))


def _worker(rank: int, world: int, job: Job, model: nn.Module, counters: torch.Tensor,
            clocks: torch.Tensor, lock, seen: torch.Tensor) -> None:
    cfg = job.config
    # threads: a share of the cores (never oversubscribed); device: the shared model's
    place = setup_rank(cfg, rank, world, DEVICE, data_bytes=train_bytes(job))
    tb = job.run_dir / "tensorboard" if cfg.tensorboard else None
    log = EventLog(job.run_dir / "events.jsonl", rank=rank, role="worker", tensorboard_dir=tb)
    hooks = _HogwildHooks(job, rank, world, model, place, counters, lock)
    report = StepReporter(cfg, log, hooks.total, f"hogwild{'-lock' if lock else ''}",
                          shows_progress=rank == 0, evaluates=rank == 0, shards=cfg.workers)
    batches = batch_stream(job.shard(rank, world), cfg.batch_size, cfg.seed + rank)
    clocks[rank, 0] = time.time()  # wall clock: comparable across processes
    Loop(cfg, report, hooks, batches, hooks.total, straggler=hooks.kit.straggler).run()
    clocks[rank, 1] = time.time()
    log.close()
    dist.barrier()  # sync point: every worker's last update is in the shared model
    if rank == 0:
        seen[0] = _checksum(model)


SPEC = StrategySpec(
    name="hogwild",
    summary="Hogwild!: worker processes update one shared model without locks (--lock)",
    run=run, world_size=world_size, options=("lock",), shards_by="workers", device=DEVICE,
    local_only="single-host only (its worker processes share one model in shared memory); "
               "run it with phalanx train")
