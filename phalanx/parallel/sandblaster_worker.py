"""A Sandblaster worker: compute the summed gradient of the portions the coordinator hands
out, at the point the shards serve.

For each portion (evaluation e, portion p, sample range [a, b)): if the worker has not
fetched evaluation e's point yet, it pulls it from every shard (once per batch); then it
computes the summed loss and gradient over those samples, pushes each shard its slice of
the gradient (``PUSH``, clock = e, seq = p) and tells the coordinator the loss (``TASK
RESULT``). A shard that has moved past e answers the pull with an empty slice: the
portion is outdated (a backup already answered it) and is skipped. A background
:class:`~phalanx.ps.client.Heartbeat` tells the coordinator the worker is alive while it
computes a long portion.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch
from torch import nn

from phalanx.comm.transport import Transport
from phalanx.comm.wire import Header, Kind
from phalanx.errors import PhalanxError
from phalanx.metrics import EventLog
from phalanx.models.loss import correct as count_correct
from phalanx.models.loss import token_cross_entropy
from phalanx.parallel.base import Job
from phalanx.parallel.worker import WorkerKit
from phalanx.ps.client import Heartbeat
from phalanx.ps.partition import Partition, flat_dense, partition, trainable, unflatten_into
from phalanx.ps.server import Layout
from phalanx.runtime.faults import KILLED_WORKER_EXIT, die, kill_point, parse_kills


class TaskOp(IntEnum):
    """``Header.flags`` of a TASK message."""

    PORTION = 1  # coordinator -> worker: int64 [first sample, end]; clock = e, seq = p
    RESULT = 2  # worker -> coordinator: float64 [loss sum, samples, correct]
    SKIPPED = 3  # worker -> coordinator: the portion's evaluation was over
    STOP = 4  # coordinator -> worker: the run is over
    STATS = 5  # worker -> coordinator: float64 WORKER_STATS


WORKER_STATS = ("samples", "portions", "bytes_sent", "bytes_received")


@dataclass(frozen=True)
class SandblasterLayout:
    """Rank 0 is the coordinator, ranks 1..S the shards, S+1..S+N the workers."""

    servers: int
    workers: int
    coordinator: int = 0

    @property
    def world(self) -> int:
        return 1 + self.servers + self.workers

    def shard_rank(self, k: int) -> int:
        return 1 + k

    def worker_rank(self, w: int) -> int:
        return 1 + self.servers + w

    def worker_of(self, rank: int) -> int | None:
        w = rank - 1 - self.servers
        return w if 0 <= w < self.workers else None

    def shard_of(self, rank: int) -> int | None:
        k = rank - 1
        return k if 0 <= k < self.servers else None


def model_partition(model: nn.Module, shards: int) -> Partition:
    # every parameter is dense here: L-BFGS's vectors cover all of them
    return partition(model, shards, sparse=False)


class SandblasterWorker:
    def __init__(self, job: Job, transport: Transport, layout: SandblasterLayout,
                 worker: int, log: EventLog) -> None:
        cfg = job.config
        self.job, self.transport, self.layout, self.worker, self.log = (
            job, transport, layout, worker, log)
        self.model = job.build_model()
        self.params = trainable(self.model)
        self.part = model_partition(self.model, cfg.servers)
        self.flat = flat_dense(self.part, self.params)
        # the shared set-up's straggler (L-BFGS portions take no augmentation, no
        # sampled batches: the generator and loss of the kit are not used here)
        self.straggler = WorkerKit.of(cfg, worker).straggler
        self.kill_at = kill_point(parse_kills(cfg.kill_worker, "--kill-worker"), worker)
        # Heartbeat sends to "server" ranks 0..servers-1: with one, that is the coordinator
        self.heartbeat = Heartbeat(transport, Layout(1, cfg.workers), worker, cfg.heartbeat_s)
        self.fetched = -1
        self.samples = self.portions = 0

    def run(self) -> None:
        self.heartbeat.start()
        try:
            while True:
                msg = self.transport.recv(src=self.layout.coordinator)
                h = msg.header
                if h.kind != Kind.TASK or h.flags not in (TaskOp.PORTION, TaskOp.STOP):
                    raise PhalanxError(f"sandblaster worker {self.worker}: unexpected message "
                                       f"kind {h.kind} from the coordinator")
                if h.flags == TaskOp.STOP:
                    break
                start, end = msg.tensors[0].tolist()
                self.portion(h.clock, h.seq, int(start), int(end))
        finally:
            self.heartbeat.stop()
        self.transport.flush()  # our pushes are with the shards before we report done
        stats = torch.tensor([self.samples, self.portions, self.transport.counter.sent,
                              self.transport.counter.received], dtype=torch.float64)
        self.transport.send(self.layout.coordinator,
                            Header(Kind.TASK, worker=self.worker, flags=TaskOp.STATS), [stats])
        self.transport.flush()

    def pull(self, evaluation: int) -> bool:
        """Fetch evaluation ``evaluation``'s point from every shard; False if it is over."""
        for k in range(self.part.shards):
            self.transport.send(self.layout.shard_rank(k),
                                Header(Kind.PULL, worker=self.worker, clock=evaluation, shard=k))
        current = True
        for k in range(self.part.shards):
            msg = self.transport.recv(src=self.layout.shard_rank(k))
            a, b = self.part.dense_range(k)
            t = msg.tensors
            if msg.header.kind != Kind.PARAMS or len(t) != 1:
                raise PhalanxError(f"sandblaster worker {self.worker}: shard {k} answered a "
                                   "pull with a malformed message")
            if msg.header.clock != evaluation or t[0].numel() != b - a:
                current = False
                continue
            self.flat[a:b] = t[0]
        if current:
            unflatten_into(self.part, self.flat, self.params)
        return current

    def portion(self, evaluation: int, portion: int, start: int, end: int) -> None:
        if self.portions == self.kill_at:
            die(self.log.log, "worker", self.worker, f"portion {self.portions}",
                KILLED_WORKER_EXIT)
        coordinator = self.layout.coordinator
        if evaluation != self.fetched:
            if not self.pull(evaluation):
                self.transport.send(coordinator, Header(Kind.TASK, worker=self.worker,
                                                        clock=evaluation, seq=portion,
                                                        flags=TaskOp.SKIPPED))
                return
            self.fetched = evaluation
        x, y = self.job.train.x[start:end], self.job.train.y[start:end]
        self.straggler.start()
        out = self.model(x)
        # a sum over samples (of each sample's mean over its tokens, for a language model),
        # not a mean: the shards add the portions and divide by the batch size
        loss = token_cross_entropy(out, y, reduction="sum") / (y[0].numel() if len(y) else 1)
        grads = torch.autograd.grad(loss, self.params)
        self.straggler.finish()
        g = flat_dense(self.part, list(grads))
        for k in range(self.part.shards):
            a, b = self.part.dense_range(k)
            self.transport.send(self.layout.shard_rank(k),
                                Header(Kind.PUSH, worker=self.worker, clock=evaluation,
                                       seq=portion, shard=k), [g[a:b]])
        # the pushes leave before the coordinator hears the portion is done: it counts a
        # reported portion as computed, and the shards' ACCEPT waits for every portion's
        # push, so a push still queued when this worker dies (it reported, then was
        # killed) would stall the iteration. Sent sockets' data survives the process.
        self.transport.flush()
        correct = count_correct(out, y).item() / (y[0].numel() if len(y) else 1)
        result = torch.tensor([loss.item(), end - start, correct], dtype=torch.float64)
        self.transport.send(coordinator, Header(Kind.TASK, worker=self.worker, clock=evaluation,
                                                seq=portion, flags=TaskOp.RESULT), [result])
        self.samples += end - start
        self.portions += 1
