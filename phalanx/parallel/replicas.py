"""What the replicated data-parallel workers (``sync``, ``average``) share: their replica,
started from rank 0's values, the allreduce, the rule, the data stream, checkpoints and
``--resume`` (:mod:`phalanx.parallel.dp_checkpoint`), and the run of the one
:class:`~phalanx.parallel.loop.Loop`. Each strategy subclasses :class:`ReplicaHooks` with
its own ``forward_backward`` and ``step``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from phalanx.comm.allreduce import make_allreduce
from phalanx.comm.counters import ByteCounter
from phalanx.comm.exchange import Compression
from phalanx.comm.staging import gloo_carries, staged
from phalanx.errors import ConfigError
from phalanx.metrics import EventLog
from phalanx.parallel.base import Job, detached
from phalanx.parallel.device_data import DeviceData, train_bytes
from phalanx.parallel.dp_checkpoint import Checkpointer
from phalanx.parallel.loop import Batch, Hooks, Loop, Micro, Position, backward, batch_stream
from phalanx.parallel.precision import precision_of
from phalanx.parallel.worker import StepReporter, WorkerKit
from phalanx.rules import apply_updates, make_rule, update_owned
from phalanx.rules.sparse import TableRule, sparse_table
from phalanx.runtime.placement import CPU, DeviceSupport, Placement, setup_rank

DEVICE = DeviceSupport()  # collectives between known peers: NCCL where each rank has a GPU


def check_shards(job: Job, world: int) -> int:
    """Micro-batches per epoch every worker takes (that of the smallest shard)."""
    cfg = job.config
    per_epoch = len(job.train) // world // cfg.batch_size
    if per_epoch == 0:
        raise ConfigError(f"--batch-size: {cfg.batch_size} is larger than a worker's shard "
                          f"({len(job.train) // world} samples with --workers {world})")
    return per_epoch


def worker_batches(job: Job, rank: int, world: int,
                   skip: int = 0) -> Iterator[tuple[int, torch.Tensor]]:
    """(epoch, indices) of this worker's micro-batches, forever, after the first ``skip``.
    Every worker takes the same number per epoch (that of the smallest shard) so
    collectives stay matched."""
    cfg = job.config
    return batch_stream(job.shard(rank, world), cfg.batch_size, cfg.seed,
                        per_epoch=check_shards(job, world), skip=skip)


def total_steps(job: Job, world: int) -> int:
    """Optimizer steps every worker takes."""
    return job.planned_steps(len(job.train) // world)


def broadcast_from_rank0(tensors: list[torch.Tensor], counter: ByteCounter, rank: int,
                         world: int) -> None:
    """Start every replica from rank 0's values (a user model with random init, or BN
    buffers): one flat broadcast."""
    if world == 1 or not tensors:
        return
    flat = torch.cat([t.detach().reshape(-1).float() for t in tensors])
    flat = flat.to("cpu") if gloo_carries(flat) else flat  # gloo: through the host
    dist.broadcast(flat, src=0)
    if rank == 0:
        counter.on_send(flat.numel() * flat.element_size() * (world - 1))
    else:
        counter.on_recv(flat.numel() * flat.element_size())
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t).to(t.dtype))
            offset += n


def total_bytes(counter: ByteCounter) -> int:
    """All ranks' bytes sent (a bookkeeping collective, not counted itself)."""
    t = torch.tensor([counter.sent], dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return int(t.item())


@dataclass
class WorkerContext:
    """What the training loop of one worker needs besides the model."""

    job: Job
    rank: int
    world: int
    log: EventLog
    t0: float
    placement: Placement = CPU  # this rank's device, backend, threads (setup_rank)

    def reporter(self, total: int, label: str) -> StepReporter:
        """Rank 0 shows progress and evaluates; a resumed run's clock continues
        (``t0`` moved back by the checkpoint's elapsed time first)."""
        return StepReporter(self.job.config, self.log, total, label,
                            shows_progress=self.rank == 0, evaluates=self.rank == 0,
                            t0=self.t0, shards=self.world)


def run_replica(train_worker, rank: int, world: int, job: Job) -> None:
    """One data-parallel worker inside an initialised process group (spawn or torchrun):
    its device and threads, its log, then ``train_worker(ctx)``."""
    place = setup_rank(job.config, rank, world, DEVICE, data_bytes=train_bytes(job))
    with open_log(job, rank) as log:
        train_worker(WorkerContext(job, rank, world, log, time.perf_counter(), place))


def open_log(job: Job, rank: int) -> EventLog:
    cfg = job.config
    tb = job.run_dir / "tensorboard" if cfg.tensorboard else None
    return EventLog(job.run_dir / "events.jsonl", rank=rank, role="worker", tensorboard_dir=tb)


class ReplicaHooks(Hooks):
    """One replica of a data-parallel group. Subclasses set ``label`` and
    ``shared_rule_state`` (the replicas share one rule state: sync; each its own: average)
    and write ``forward_backward`` and ``step``."""

    label = "replica"
    shared_rule_state = True
    # every rank holds the whole model with the rule's state for all of it, started from
    # rank 0's values here. False (zero): the subclass starts its ranks alike and builds
    # the rule's state itself, for its shards only: a whole-model state (Adam: 8 bytes a
    # parameter) and a flat copy for the broadcast would be the peak of its start-up
    whole_replica = True

    def __init__(self, ctx: WorkerContext) -> None:
        job, rank, world = ctx.job, ctx.rank, ctx.world
        cfg = self.cfg = job.config
        self.ctx, self.job, self.rank, self.world = ctx, job, rank, world
        self.model = job.build_model().to(ctx.placement.torch_device)
        self.model.train()
        self.test = job.test
        self.counter = ByteCounter()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if self.whole_replica:
            # DDP does the same: equal start even if model_fn was not seeded deterministically
            broadcast_from_rank0(self.params + list(self.model.buffers()), self.counter,
                                 rank, world)
        self.allreduce = staged(make_allreduce(cfg.allreduce, counter=self.counter),
                                ctx.placement.host_staging)
        self.buffers = [b for b in self.model.buffers() if b.is_floating_point()]
        self.total = total_steps(job, world)
        self.weights = detached(self.params) if self.whole_replica else []
        self.rule = make_rule(cfg, self.total)
        # a sparse-gradient table (the click model's): a sparse gradient updates only the
        # rows it holds (rules/sparse.py); a densified one, the whole table
        self.table = sparse_table(self.model, self.params)
        self.table_rule = TableRule(self.rule, self.table) if self.table is not None else None
        self.state = (None if not self.whole_replica
                      else self.table_rule.init(self.weights) if self.table_rule is not None
                      else self.rule.init(self.weights))
        self.precision = precision_of(cfg)  # --precision: the forward's autocast
        self.kit = WorkerKit.of(cfg, rank)
        self.data = DeviceData(job.train, ctx.placement.torch_device,
                               ctx.placement.data_on_device, self.kit.aug is not None)
        self.ckpt = Checkpointer(cfg, job.run_dir, rank, world, ctx.log,
                                 self.shared_rule_state)
        # --compress: this sender's codec and error-feedback residuals (its state is
        # checkpointed with the rest)
        self.compression = Compression.from_config(cfg)
        # the checkpoint holds rank 0's (= every rank's) weights: the broadcast above ran
        # on the fresh model, so each rank loads them itself
        self.start = self.restore() if cfg.resume else Position()
        ctx.t0 -= self.start.wall_s

    def restore(self) -> Position:
        """``--resume``: the checkpoint's state into this replica; where it stands."""
        return self.ckpt.restore(self.model, self.state, self.kit.gen, self.counter,
                                 self.compression, self.ctx.placement.torch_device)

    def before_step(self, step: int) -> None:
        self.ckpt.maybe_kill(step)  # --kill-worker: about to start step + 1

    def fetch(self, idx: torch.Tensor, first: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data.batch(idx, self.kit.aug, self.kit.gen)

    def compute(self, batch: Batch, scale: float) -> Micro:
        """Forward and backward of one micro-batch; ``.grad`` accumulates."""
        return backward(self.model, self.kit.loss_fn, batch, scale, self.precision)

    def apply(self, grads: list[torch.Tensor]) -> None:
        """The rule's update on the replica's weights; the gradients are cleared."""
        if self.table_rule is not None:
            self.state = self.table_rule.step(grads, self.state, self.weights)
        else:
            # the gradients are this step's own (cleared below): updated in place
            updates, self.state = update_owned(self.rule, grads, self.state, self.weights)
            apply_updates(self.weights, updates)
        for p in self.params:
            p.grad = None

    def checkpoint(self, pos: Position, final: bool) -> None:
        self.ckpt.save(self.model, self.state, pos, self.kit.gen, self.counter,
                       self.compression)

    def can_stop_after(self, step: int) -> bool:
        return True  # its checkpoint resumes the same trajectory (dp_checkpoint)

    def train(self) -> Position:
        """The loop over this worker's shard, from where a checkpoint left off."""
        cfg, ctx = self.cfg, self.ctx
        report = ctx.reporter(self.total, f"{self.label} x{self.world}")
        batches = worker_batches(self.job, self.rank, self.world,
                                 skip=self.start.step * cfg.grad_accum)
        return Loop(cfg, report, self, batches, self.total, start=self.start,
                    shards=self.world, straggler=self.kit.straggler).run()

    def run_stats(self, samples: int) -> dict[str, Any]:
        """The statistics every replicated strategy reports (a collective: every rank)."""
        sent = total_bytes(self.counter)
        return {"bytes_sent": sent, "bytes_per_sample": sent / max(samples * self.world, 1),
                "allreduce": self.cfg.allreduce, "bytes_estimated": self.allreduce.estimated,
                "compress": self.cfg.compress}
