"""A parameter-server worker process: pull, compute, push, for its shard of the data.

Downpour (``--nfetch`` > 1): between fetches the worker applies each of its gradients to
its own copy of the weights with plain SGD at ``--lr`` (following ``--schedule`` over the
worker's steps), as the client of Dean et al. 2012 (Algorithm 7.1) does, while the summed
gradients still go to the servers every ``--npush`` steps; a fetch replaces the local
weights. ``--no-downpour-local-steps`` computes every step of a fetch period on the
fetched weights instead.

Worker 0 evaluates the servers' current weights once per epoch (or every ``--eval-every``
steps). A background :class:`~phalanx.ps.client.Heartbeat` tells the shards the worker is
alive. Under ``--resume`` the worker asks the shards where it stands and continues from
that clock (same data order: the epoch's batches are skipped up to that step). Fault
injection: ``--kill-worker`` exits the process at a step, ``--drop-messages`` loses pushes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

import torch

from phalanx.comm.counters import nbytes
from phalanx.comm.exchange import compression_for
from phalanx.comm.staging import host_vector, to_host
from phalanx.comm.transport import Transport
from phalanx.comm.wire import HEADER_BYTES
from phalanx.data import steps_per_epoch
from phalanx.metrics import EventLog
from phalanx.metrics.noise import JobProbe
from phalanx.models.ctr import table_rows
from phalanx.parallel.base import Job
from phalanx.parallel.device_data import DeviceData
from phalanx.parallel.loop import Batch, Hooks, Loop, Micro, Position, backward, batch_stream
from phalanx.parallel.worker import StepReporter, WorkerKit
from phalanx.ps.client import Heartbeat, PSClient
from phalanx.ps.partition import flat_dense, partition, trainable, unflatten_into
from phalanx.ps.server import Layout
from phalanx.rules import make_schedule
from phalanx.rules.sparse import sparse_rows
from phalanx.runtime.faults import (
    KILLED_WORKER_EXIT,
    MessageDropper,
    die,
    kill_point,
    parse_kills,
)
from phalanx.runtime.placement import CPU, Placement


@dataclass
class WorkerStats:
    """What a worker tells the shards when it is done. On the wire it is a float64 tensor in
    the order of the fields (every count is far below 2^53, exact in a double); the names
    travel with the dataclass, never as a positional convention at the reader."""

    samples: int = 0
    steps: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    pushes_dropped: int = 0
    pushes_skipped: int = 0
    values_clipped: int = 0

    def tensor(self) -> torch.Tensor:
        return torch.tensor([float(getattr(self, f.name)) for f in fields(self)],
                            dtype=torch.float64)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> WorkerStats:
        names = [f.name for f in fields(cls)]
        if t.numel() != len(names):
            raise ValueError(f"worker statistics: {t.numel()} values, expected {len(names)}")
        return cls(**{n: int(v) for n, v in zip(names, t.tolist())})



def steps_per_worker(job: Job) -> int:
    """Every worker takes the same number of steps (the smallest shard decides), so BSP and
    SSP never wait on a worker that has stopped early."""
    n = job.config.workers
    return min(job.planned_steps(len(job.shard(w, n))) for w in range(n))


class PSWorker(Hooks):
    """One worker of the parameter server: the loop's hooks pull (every ``--nfetch``
    steps, and the table rows of every batch), compute, and push (every ``--npush``)."""

    def __init__(self, job: Job, transport: Transport, layout: Layout, worker: int,
                 log: EventLog, placement: Placement = CPU) -> None:
        cfg = self.cfg = job.config
        self.job, self.transport, self.worker, self.log = job, transport, worker, log
        self.place, self.device = placement, placement.torch_device
        self.model = job.build_model().to(self.device)
        self.model.train()
        self.params = trainable(self.model)
        self.part = partition(self.model, cfg.servers)
        # the shards speak host tensors: pulled weights land in this host vector (pinned
        # on a GPU rank) and go to the device in one copy
        self.flat = host_vector(flat_dense(self.part, self.params))
        self.table = self.params[self.part.table.param] if self.part.table else None
        self.dropper = (MessageDropper(cfg.drop_messages, seed=cfg.seed * 7919 + worker)
                        if cfg.drop_messages else None)
        # a worker waits longer than a server: when a peer dies, the server (which knows
        # who is silent) should be the one to end the run, with the better message
        self.client = PSClient(transport, self.part, layout, worker, 2 * cfg.ps_timeout + 10,
                               self.dropper)
        self.client.compression = compression_for(cfg)  # --compress: pushes and pulls
        self.kill_at = kill_point(parse_kills(cfg.kill_worker, "--kill-worker"), worker)
        self.shard = job.shard(worker, cfg.workers)
        self.total = steps_per_worker(job)
        self.heartbeat = Heartbeat(transport, layout, worker, cfg.heartbeat_s)
        self.step = self.clock = self.samples = 0
        self.report: StepReporter | None = None  # made when training starts
        # --pull-ahead (asp, downpour; not with a sparse table, whose rows depend on the
        # next batch): the next weights are asked for before this step's compute, so
        # their round trip hides behind it; `ahead` holds the requests in flight
        self.pulls_ahead = cfg.pull_ahead and self.table is None
        self.ahead: list | None = None
        # the pull sent with the push (PUSH_PULL) where nothing the pull needs comes later
        self.merge_pulls = (self.table is None and self.client.compression is None
                            and self.dropper is None and not self.pulls_ahead)
        # Downpour's local steps (only a fetch period longer than one step has any)
        self.local_steps = cfg.downpour_local_steps and cfg.nfetch > 1
        self.local_lr = make_schedule(cfg, self.total)
        # what the steps since the last push accumulated
        self.acc_dense: torch.Tensor | None = None
        self.acc_versions: list[int] | None = None
        self.acc_rows: list[torch.Tensor] = []
        self.acc_row_grads: list[torch.Tensor] = []
        self.step_rows: list[torch.Tensor] = []  # this step's micro-batches' table rows
        # seconds blocked on the shards (pulls, barriers, pushes) while other workers share
        # them: the sync time of a scheduler's step-time model (perf events). A lone
        # worker's exchange is part of its step, as a lone GPU's optimizer step is: that
        # model has no sync term for one replica (cluster/learned.py)
        self.wait_s = 0.0
        self.shared = job.config.workers > 1
        self.probe: JobProbe | None = None

    # ---- talking to the shards ---------------------------------------------------------

    def pull(self, rows: torch.Tensor | None, dense: bool, resume: bool = False) -> None:
        t0 = time.perf_counter()
        with torch.no_grad():
            if self.ahead is not None:
                # the answer to the pull asked ahead (it may have arrived during compute)
                asked, self.ahead = self.ahead, None
                self.client.collect(asked, self.flat)
                if not dense or rows is not None:
                    raise AssertionError("a pull ahead is dense and has no rows")
            else:
                self.client.pull(self.clock, self.flat if dense else None, rows,
                                 self.table.data if self.table is not None else None,
                                 resume=resume)
        if self.shared:
            self.wait_s += time.perf_counter() - t0
        if dense:
            unflatten_into(self.part, self.flat.to(self.device), self.params)

    def pull_ahead(self) -> None:
        """Ask every shard for the weights the next step trains on, now."""
        if self.pulls_ahead and self.step + 1 < self.total and (self.step + 1) % \
                self.cfg.nfetch == 0:
            self.ahead = self.client.request(self.clock, held=self.flat)

    def evaluate_now(self, epoch: int, samples: int) -> None:
        if self.ahead is not None:
            self.pull(None, dense=True)  # drain the pull asked ahead first
        # evaluate the servers' weights, not a stale copy (with a table: the test set's rows)
        rows = table_rows(self.model, self.job.test.x).cpu() if self.table is not None else None
        self.pull(rows, dense=True)
        self.report.evaluate(self.model, self.job.test, self.step, epoch, samples)

    def resume(self) -> None:
        """A restarted worker: the shards say how far it got (the smallest clock any shard
        restored; a shard that is ahead ignores the repeated pushes by sequence number).
        The batches before that step were trained on before the crash."""
        self.pull(None, dense=True, resume=True)
        if self.client.left:
            # dropped as dead before the run stopped: the resumed run goes on without it,
            # as the run it continues did (a shard that had not dropped it yet does so
            # when its heartbeats stop)
            self.log.log("left", worker=self.worker, shards=sorted(self.client.left))
            return
        self.clock = min(self.client.server_clocks)
        self.step = min(self.clock * self.cfg.npush, self.total)
        self.samples = self.step * self.cfg.batch_size * self.cfg.grad_accum
        self.log.log("resume", worker=self.worker, clock=self.clock, step=self.step)

    def local_step(self, grads: tuple[torch.Tensor, ...]) -> None:
        """``w <- w - lr(step) * g`` on the local dense weights, so the next step of this
        fetch period is computed on them. ``self.flat`` keeps the fetched copy untouched: a
        compressed pull's delta is decoded against it. The table's rows are pulled fresh
        every step, so a local step on them would be overwritten: they are skipped."""
        lr = self.local_lr(self.step)
        with torch.no_grad():
            for i in self.part.dense_params:
                self.params[i].sub_(grads[i], alpha=lr)

    # ---- the loop ----------------------------------------------------------------------

    def run(self) -> None:
        # a live worker is never silent, even while a barrier holds it: the shards tell a
        # dead worker from a busy one by these heartbeats
        self.heartbeat.start()
        try:
            self.train()
        finally:
            self.heartbeat.stop()
        if not self.client.left:
            self.done()

    def train(self) -> None:
        cfg, job = self.cfg, self.job
        self.kit = WorkerKit.of(cfg, self.worker)
        self.data = DeviceData(job.train, self.device, self.place.data_on_device,
                               self.kit.aug is not None)
        if cfg.resume:
            self.resume()
            if self.client.left:
                return
        first = self.worker == 0  # shows progress and evaluates the servers' weights
        self.report = StepReporter(cfg, self.log, self.total, cfg.strategy,
                                   shows_progress=first, evaluates=first, shards=cfg.workers)
        skip = self.step * cfg.grad_accum  # resumed: micro-batches trained on before
        batches = batch_stream(self.shard, cfg.batch_size, cfg.seed, skip=skip)
        per_epoch = steps_per_epoch(len(self.shard), cfg.batch_size)
        start = Position(self.step, skip // per_epoch, self.samples)
        # worker 0 reports its step times at (workers, batch) to a scheduler (per_step 1:
        # no noise estimate here; under BSP the shards log theirs, ps/noise_part.py)
        self.probe = JobProbe(self.params, cfg.batch_size, 1, cfg.workers, self.log,
                              active=first)
        try:
            pos = Loop(cfg, self.report, self, batches, self.total, start=start,
                       shards=cfg.workers, straggler=self.kit.straggler).run()
        finally:
            self.probe.close()
        self.samples = pos.samples

    # ---- the loop's hooks --------------------------------------------------------------

    def before_step(self, step: int) -> None:
        if step == self.kill_at:
            die(self.log.log, "worker", self.worker, f"step {step}", KILLED_WORKER_EXIT)

    def fetch(self, idx: torch.Tensor, first: bool) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.data.batch(idx, self.kit.aug, self.kit.gen)
        # the table rows the batch reads go to the shards
        rows = table_rows(self.model, x).cpu() if self.table is not None else None
        if first and self.step % self.cfg.nfetch == 0:
            self.pull(rows, dense=True)  # BSP / SSP workers wait here
        elif rows is not None:
            self.pull(rows, dense=False)  # this batch's table rows are always fresh
        if rows is not None:
            self.step_rows.append(rows)
        if self.acc_versions is None:
            self.acc_versions = list(self.client.versions)  # staleness counts from here
        if first:
            self.pull_ahead()
        return x, y

    def forward_backward(self, batch: Batch, scale: float, last: bool) -> Micro:
        return backward(self.model, self.kit.loss_fn, batch, scale)

    def apply_update(self, step: int) -> dict:
        """Accumulate the step's gradient; push every ``--npush`` steps and at the last.
        ``step`` is 1-based; ``self.step`` counts the steps done before it."""
        cfg, part = self.cfg, self.part
        grads = [p.grad for p in self.params]
        g = flat_dense(part, grads)
        if self.local_steps and step % cfg.nfetch and step < self.total:
            self.local_step(grads)  # the next step is not a fetch: it sees this one
        self.acc_dense = g if self.acc_dense is None else self.acc_dense + g
        if self.table is not None:
            rows = torch.unique(torch.cat(self.step_rows))
            self.acc_rows.append(rows)
            self.acc_row_grads.append(_row_grads(grads[part.table.param], rows))
            self.step_rows = []
        for p in self.params:
            p.grad = None
        self.step = step
        if step % cfg.npush == 0 or step == self.total:
            t0 = time.perf_counter()
            self.push()
            if self.shared:
                self.wait_s += time.perf_counter() - t0
        if self.probe is not None:
            self.probe.step(step, self.wait_s)
        return {"bytes_sent": self.transport.counter.sent}

    def push(self) -> None:
        ids = row_grads = None
        if self.table is not None:
            ids, row_grads = _coalesce(self.acc_rows, self.acc_row_grads)
        # the pull of the next step travels with this push when nothing comes between
        # them that the pull depends on: no rows to ask for (they depend on the next
        # batch), no compression (its checksum cadence), no lossy link, no pull ahead
        with_pull = (self.merge_pulls and self.step < self.total
                     and self.step % self.cfg.nfetch == 0)
        # a fresh host copy per push (no reused buffer): the send is asynchronous
        asked = self.client.push(self.clock, to_host(self.acc_dense), self.acc_versions, ids,
                                 to_host(row_grads) if row_grads is not None else None,
                                 pull=with_pull)
        if with_pull:
            self.ahead = asked  # collected by the next step's pull
        self.clock += 1
        self.acc_dense = self.acc_versions = None
        self.acc_rows, self.acc_row_grads = [], []

    def evaluate(self, report: StepReporter, step: int, epoch: int, samples: int) -> None:
        if report.evaluates:
            self.evaluate_now(epoch, samples)

    def done(self) -> None:
        # every worker sends its buffers (BatchNorm statistics, not served by the PS):
        # the first worker that finished provides them, worker 0 unless it died
        bufs = [b.detach().reshape(-1).double().cpu() for b in self.model.buffers()]
        extra = [torch.cat(bufs) if bufs else torch.zeros(0, dtype=torch.float64)]
        # count the DONE messages themselves in bytes_sent
        done_bytes = (self.part.shards * (HEADER_BYTES + nbytes(WorkerStats().tensor()))
                      + nbytes(*extra))
        comp = self.client.compression
        stats = WorkerStats(
            samples=self.samples, steps=self.step,
            bytes_sent=self.transport.counter.sent + done_bytes,
            bytes_received=self.transport.counter.received,
            pushes_dropped=self.dropper.dropped if self.dropper is not None else 0,
            pushes_skipped=comp.screened.skipped if comp else 0,
            values_clipped=comp.screened.values_clipped if comp else 0)
        self.client.done(self.clock, stats.tensor(), extra)


def worker_main(job: Job, transport: Transport, layout: Layout, worker: int,
                log: EventLog, placement: Placement = CPU) -> None:
    PSWorker(job, transport, layout, worker, log, placement).run()


def _row_grads(grad: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The gradient rows ``rows`` (sorted, unique: every row the step's batches read) of the
    table's gradient, dense or sparse (``sparse=True`` embeddings: only the rows read are
    in it, never the whole table)."""
    if not grad.is_sparse:
        return grad[rows.to(grad.device)]
    ids, values = sparse_rows(grad)
    out = torch.zeros(len(rows), values.shape[-1], dtype=values.dtype, device=values.device)
    out.index_add_(0, torch.searchsorted(rows.to(ids.device), ids), values)
    return out


def _coalesce(rows: list[torch.Tensor], grads: list[torch.Tensor]):
    """Sum the row gradients of several steps (Downpour's npush) into one row per id."""
    ids = torch.cat(rows)
    uniq, inverse = torch.unique(ids, return_inverse=True)
    dim = grads[0].shape[-1]
    out = torch.zeros(len(uniq), dim, dtype=grads[0].dtype, device=grads[0].device)
    out.index_add_(0, inverse.to(out.device), torch.cat(grads).view(-1, dim))
    return uniq, out
