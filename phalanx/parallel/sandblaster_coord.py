"""The Sandblaster coordinator: runs L-BFGS, holds no parameters.

Each function evaluation is one batch (the whole training set: L-BFGS is a batch method),
cut into portions that :class:`~phalanx.ps.portions.PortionScheduler` hands to free
workers. The optimizer's vector work is done by the shards on their slices
(:mod:`phalanx.ps.sandblaster_shard`): the coordinator sends DIRECTION / TRIAL / ACCEPT
commands with a few scalars and combines the partial scalars they return
(:mod:`phalanx.ps.vector_lbfgs`). Whole vectors reach the coordinator only to evaluate
the test accuracy and to write the final model (FETCH, counted apart).

The iteration follows ``torch.optim.LBFGS`` (first step ``min(1, 1/|g|_1) * lr``, later
``lr``; its stopping tests with tolerance_grad 1e-7 and tolerance_change 1e-9). Line
search: ``none`` takes that step as it is (torch's ``line_search_fn=None``);
``backtracking`` halves it until the Armijo condition ``f(x + t d) <= f(x) + 1e-4 t g.d``
holds (at most 10 trials; if none passes the run stops at x).

Besides torch's tests (which float32 losses practically never meet) the run stops once
the loss stalls: a relative decrease below ``STALL_TOL`` over the last ``STALL_WINDOW``
iterations. ``Coordinator.stop_reason`` says which test ended it; a run that ends with 0
iterations is an error (:func:`check_progress`), never a result.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from phalanx.comm.counters import nbytes
from phalanx.comm.transport import PeerLost, Transport, TransportTimeout
from phalanx.comm.wire import HEADER_BYTES, Header, Kind, WireError
from phalanx.errors import PhalanxError
from phalanx.metrics import EventLog, Progress
from phalanx.parallel.base import Job, evaluate
from phalanx.parallel.sandblaster_worker import (
    WORKER_STATS,
    SandblasterLayout,
    TaskOp,
    model_partition,
)
from phalanx.ps.partition import trainable, unflatten_into
from phalanx.ps.portions import PortionCounts, PortionScheduler
from phalanx.ps.sandblaster_shard import SHARD_STATS, Op
from phalanx.ps.vector_lbfgs import GradientDots, GramLBFGS

TOL_GRAD = 1e-7  # torch.optim.LBFGS defaults
TOL_CHANGE = 1e-9
ARMIJO_C1 = 1e-4
MAX_TRIALS = 10
# converged: the loss fell by less than STALL_TOL (relative) over STALL_WINDOW iterations
# (docs/parameter-server.md: logreg on Fashion-MNIST stalls there, at its test accuracy)
STALL_WINDOW = 10
STALL_TOL = 1e-3


class NoProgress(PhalanxError):
    """L-BFGS ended before its first iteration: the run trained nothing."""


def check_progress(iterations: int, reason: str) -> None:
    if iterations == 0:
        hint = "; try a smaller --lr" if reason.startswith("line search") else ""
        raise NoProgress(f"sandblaster: 0 L-BFGS iterations ({reason}): the run trained "
                         f"nothing{hint}")


def stalled(losses: list[float]) -> bool:
    """The loss fell by less than STALL_TOL (relative) over the last STALL_WINDOW
    iterations (``losses[0]`` is the starting point's)."""
    if len(losses) <= STALL_WINDOW:
        return False
    before, now = losses[-1 - STALL_WINDOW], losses[-1]
    return before - now <= STALL_TOL * max(abs(now), 1e-12)


def portions_for(cfg) -> int:
    if cfg.static_portions:
        return cfg.workers
    return cfg.portions or 8 * cfg.workers


class ShardLink:
    """Vector commands to every shard and their replies; counts the coordinator's bytes
    with the shards (``bytes``) and the shards' own totals (``shard_bytes``)."""

    def __init__(self, transport: Transport, layout: SandblasterLayout, timeout_s: float):
        self.transport, self.layout, self.timeout_s = transport, layout, timeout_s
        self.bytes = 0
        self.shard_sent = [0] * layout.servers  # each shard's bytes so far (its replies say)
        self.shard_received = [0] * layout.servers

    @property
    def shard_bytes(self) -> int:
        return sum(self.shard_sent) + sum(self.shard_received)

    def command(self, op: Op, evaluation: int, args: list[float] = (),
                control: bool = False) -> list[torch.Tensor]:
        payload = torch.tensor(list(args), dtype=torch.float64)
        for k in range(self.layout.servers):
            self.transport.send(self.layout.shard_rank(k),
                                Header(Kind.VECTOR, clock=evaluation, shard=k, flags=op),
                                [payload])
            self.bytes += HEADER_BYTES + nbytes(payload)
        out = []
        for k in range(self.layout.servers):
            try:
                msg = self.transport.recv(src=self.layout.shard_rank(k),
                                          timeout_s=self.timeout_s, control=control)
            except (TransportTimeout, PeerLost, WireError) as e:
                raise PhalanxError(f"sandblaster coordinator: shard {k} did not answer "
                                   f"{op.name} ({e})") from None
            h, t = msg.header, msg.tensors
            if h.flags != op or h.shard != k or len(t) != 2 or h.clock != evaluation:
                raise PhalanxError(f"sandblaster coordinator: shard {k} answered {op.name} "
                                   "with a malformed message")
            self.bytes += HEADER_BYTES + nbytes(*t)
            self.shard_sent[k], self.shard_received[k] = (int(v) for v in t[1].tolist())
            out.append(t[0])
        return out


@dataclass
class IterationMeter:
    """Counter values at the start of an iteration, to log what it moved."""

    coordinator_bytes: int = 0
    task_bytes: int = 0
    shard_bytes: int = 0
    evals: int = 0
    counts: PortionCounts = field(default_factory=lambda: PortionCounts([]))


class Coordinator:
    def __init__(self, job: Job, transport: Transport, layout: SandblasterLayout,
                 log: EventLog) -> None:
        cfg = self.cfg = job.config
        self.job, self.transport, self.layout, self.log = job, transport, layout, log
        self.link = ShardLink(transport, layout, max(cfg.ps_timeout, 60.0))
        self.portions = portions_for(cfg)
        self.sched = PortionScheduler(cfg.workers, self.portions, static=cfg.static_portions)
        n = len(job.train)
        self.bounds = [n * p // self.portions for p in range(self.portions + 1)]
        self.last_heard = {w: time.monotonic() for w in range(cfg.workers)}
        self.evaluation = 0
        self.samples = self.evals = 0
        self.fetch_bytes = 0  # whole vectors fetched for test evaluations + the final model
        self.counts = PortionCounts([0] * cfg.workers)  # this iteration's
        self.totals = PortionCounts([0] * cfg.workers)
        self.lost: list[int] = []
        self.unnamed_losses = 0
        self.last_test_eval = -1
        self.stop_reason = ""
        self.t0 = time.perf_counter()
        self.log.log("ready", label="sandblaster")  # shards and workers connected
        # the budget is in passes over the data (function evaluations), or --max-steps
        # iterations: the bar counts what will end the run
        self.progress = Progress(cfg.max_steps or max(1, math.ceil(cfg.epochs)),
                                 "sandblaster", enabled=cfg.progress,
                                 unit="iteration" if cfg.max_steps else "pass")

    # ---- workers ---------------------------------------------------------------------

    @property
    def task_bytes(self) -> int:
        c = self.transport.counter
        return c.sent + c.received - self.link.bytes - self.fetch_bytes

    def lose(self, w: int, why: str) -> None:
        if w in self.sched.dead:
            return
        self.sched.lose(w)
        self.lost.append(w)
        self.log.log("worker_lost", worker=w, why=why, evaluation=self.evaluation)
        if not self.sched.live():
            raise PhalanxError(f"sandblaster coordinator: every worker is lost (last: "
                               f"worker {w} {why})")

    def dispatch(self) -> None:
        while True:
            lost = False
            for w, p in self.sched.assign():
                span = torch.tensor(self.bounds[p : p + 2], dtype=torch.int64)
                try:
                    self.transport.send(self.layout.worker_rank(w),
                                        Header(Kind.TASK, worker=w, clock=self.evaluation,
                                               seq=p, flags=TaskOp.PORTION), [span])
                except PeerLost:
                    self.lose(w, "lost its connection")
                    lost = True
            if not lost:
                return

    def recv_worker(self):
        """The next message from a worker (None: nothing usable arrived)."""
        try:
            msg = self.transport.recv(timeout_s=self.cfg.ps_timeout)
        except TransportTimeout:
            raise PhalanxError(f"sandblaster coordinator: no worker sent anything for "
                               f"{self.cfg.ps_timeout:g} s; presumed dead") from None
        except WireError:
            return None
        except PeerLost as e:
            w = self.layout.worker_of(e.rank) if e.rank is not None else None
            if w is not None:
                self.lose(w, "lost its connection")
            else:
                self.unnamed_losses += 1  # gloo does not say whose; heartbeats will tell
                if self.unnamed_losses > 4 * self.cfg.workers:
                    raise PhalanxError("sandblaster coordinator: connections keep "
                                       "breaking") from None
            return None
        w = self.layout.worker_of(msg.src)
        if w is None or msg.header.worker != w:
            return None
        self.last_heard[w] = time.monotonic()
        return w, msg

    def check_silent(self) -> None:
        now = time.monotonic()
        for w in self.sched.live():
            if now - self.last_heard[w] > self.cfg.ps_timeout:
                self.lose(w, f"silent for more than {self.cfg.ps_timeout:g} s")

    def run_batch(self) -> float:
        """One function evaluation at the shards' served point: the mean loss."""
        e = self.evaluation
        self.sched.begin(e)
        results: dict[int, list[float]] = {}
        self.dispatch()
        while not self.sched.complete:
            got = self.recv_worker()
            if got is not None:
                w, msg = got
                h = msg.header
                if h.kind == Kind.TASK and h.flags == TaskOp.RESULT and len(msg.tensors) == 1:
                    if self.sched.finish(w, h.clock, h.seq):
                        results[h.seq] = msg.tensors[0].tolist()
                elif h.kind == Kind.TASK and h.flags == TaskOp.SKIPPED:
                    self.sched.finish(w, h.clock, h.seq)
            self.check_silent()
            self.dispatch()
        self.counts.add(self.sched.counts)
        self.totals.add(self.sched.counts)
        loss_sum = sum(r[0] for r in results.values())
        count = sum(r[1] for r in results.values())
        self.samples += int(count)
        self.evals += 1
        self.batch_size = count
        return loss_sum / count

    # ---- shards ----------------------------------------------------------------------

    def next_evaluation(self) -> int:
        self.evaluation += 1
        return self.evaluation

    def accept(self, h: int) -> GradientDots:
        parts = self.link.command(Op.ACCEPT, self.evaluation, [self.portions, self.batch_size])
        return GradientDots.combine(parts, h)

    def fetch_model(self):
        before = self.link.bytes
        parts = self.link.command(Op.FETCH, self.evaluation)
        self.fetch_bytes += self.link.bytes - before
        self.link.bytes = before
        model = self.job.build_model()
        unflatten_into(model_partition(model, self.cfg.servers),
                       torch.cat(parts).float(), trainable(model))
        return model

    def test_eval(self, iteration: int) -> None:
        self.last_test_eval = iteration
        loss, acc = evaluate(self.fetch_model(), self.job.test)
        self.log.log("eval", step=iteration, samples=self.samples, test_loss=loss,
                     test_accuracy=acc, wall_s=time.perf_counter() - self.t0)
        self.progress.update(iteration if self.cfg.max_steps else self.evals, test_acc=acc)

    # ---- L-BFGS ----------------------------------------------------------------------

    def record(self, iteration: int, meter: IterationMeter, loss: float, dots: GradientDots,
               t: float) -> IterationMeter:
        c = self.counts
        self.log.log("lbfgs", step=iteration, loss=loss, grad_norm=math.sqrt(dots.gg),
                     step_size=t, evals=self.evals - meter.evals, samples=self.samples,
                     coordinator_bytes=self.link.bytes - meter.coordinator_bytes,
                     coordinator_task_bytes=self.task_bytes - meter.task_bytes,
                     shard_bytes=self.link.shard_bytes - meter.shard_bytes,
                     portions_per_worker=c.portions_done, backups_issued=c.backups_issued,
                     backups_wasted=c.backups_wasted, reissued=c.reissued,
                     wall_s=time.perf_counter() - self.t0)
        self.counts = PortionCounts([0] * self.cfg.workers)
        self.progress.update(iteration if self.cfg.max_steps else self.evals,
                             samples=self.samples, iteration=iteration, loss=loss)
        return IterationMeter(self.link.bytes, self.task_bytes, self.link.shard_bytes,
                              self.evals)

    def optimise(self) -> tuple[int, float]:
        """Run L-BFGS; returns (iterations, final loss). ``stop_reason`` says why it ended."""
        cfg = self.cfg
        max_iter = cfg.max_steps or 10**9
        max_evals = 10**9 if cfg.max_steps else max(1, math.ceil(cfg.epochs))
        eval_every = cfg.eval_every or max(1, min(max_iter, max_evals) // 8)
        lb = GramLBFGS(cfg.history)
        meter = IterationMeter()
        loss = self.run_batch()  # evaluation 0: the initial point
        dots = self.accept(lb.pairs)
        keep_pair = lb.observe(dots)
        meter = self.record(0, meter, loss, dots, 0.0)
        losses, n = [loss], 0
        self.stop_reason = "budget"
        if dots.max_abs_g <= TOL_GRAD:
            self.stop_reason = "gradient below tolerance at the start"
            return n, loss
        while n < max_iter and self.evals < max_evals:
            coeffs, gtd = lb.direction()
            t = (min(1.0, 1.0 / dots.abs_sum_g) if n == 0 else 1.0) * cfg.lr
            if gtd > -TOL_CHANGE:
                self.stop_reason = "not a descent direction"
                break
            parts = self.link.command(Op.DIRECTION, self.next_evaluation(),
                                      [float(keep_pair), t, *coeffs.tolist()])
            max_d = max(float(p[0]) for p in parts)
            new_loss, t, trials = self.line_search(loss, t, gtd)
            if cfg.line_search == "backtracking" and not new_loss <= loss + ARMIJO_C1 * t * gtd:
                self.link.command(Op.TRIAL, self.next_evaluation(), [0.0])  # stay at x
                self.log.log("line_search_failed", step=n + 1, trials=trials)
                self.stop_reason = f"line search failed after {trials} trials"
                break
            n += 1
            dots = self.accept(lb.pairs)
            keep_pair = lb.observe(dots)
            loss = new_loss
            losses.append(loss)
            meter = self.record(n, meter, loss, dots, t)
            if n % eval_every == 0:
                self.test_eval(n)
            reason = _converged(dots, max_d * t, losses)
            if reason:
                self.stop_reason = reason
                break
        if n and self.last_test_eval != n:
            self.test_eval(n)
        self.progress.close()
        return n, loss

    def line_search(self, loss: float, t: float, gtd: float) -> tuple[float, float, int]:
        """Evaluate the served point; with backtracking, halve t until Armijo holds (at
        most MAX_TRIALS evaluations). Returns (loss there, t, trials)."""
        new_loss = self.run_batch()
        trials = 1
        while (self.cfg.line_search == "backtracking"
               and not new_loss <= loss + ARMIJO_C1 * t * gtd and trials < MAX_TRIALS):
            t *= 0.5
            self.link.command(Op.TRIAL, self.next_evaluation(), [t])
            new_loss = self.run_batch()
            trials += 1
        return new_loss, t, trials

    # ---- the end ---------------------------------------------------------------------

    def finish(self) -> tuple[dict[int, list[float]], list[float]]:
        """Stop the workers (collect their counters), then the shards (theirs arrive on the
        control channel: a timed-out receive on the worker channel cannot swallow them)."""
        stats: dict[int, list[float]] = {}
        waiting = set(self.sched.live())
        for w in sorted(waiting):
            try:
                self.transport.send(self.layout.worker_rank(w),
                                    Header(Kind.TASK, worker=w, flags=TaskOp.STOP))
            except PeerLost:
                waiting.discard(w)
                self.lost.append(w)
        while waiting:
            try:
                got = self.recv_worker()
            except PhalanxError:
                self.lost += sorted(waiting)  # silent: dead (this channel is done with anyway)
                break
            if got is not None:
                w, msg = got
                if msg.header.kind == Kind.TASK and msg.header.flags == TaskOp.STATS:
                    stats[w] = msg.tensors[0].tolist()
                    waiting.discard(w)
            now = time.monotonic()
            for w in list(waiting):
                if now - self.last_heard[w] > self.cfg.ps_timeout:
                    waiting.discard(w)
                    self.lost.append(w)
        shard_stats = [0.0] * len(SHARD_STATS)
        for part in self.link.command(Op.STOP, self.evaluation, control=True):
            shard_stats = [a + b for a, b in zip(shard_stats, part.tolist())]
        self.transport.flush()
        return stats, shard_stats


def worker_totals(stats: dict[int, list[float]]) -> dict[int, dict[str, float]]:
    return {w: dict(zip(WORKER_STATS, v)) for w, v in stats.items()}


def _converged(dots, step: float, losses: list[float]) -> str:
    """Why L-BFGS stops after this iteration ("" to go on): the gradient, the step or the
    change in loss below tolerance, or the loss stalled."""
    if dots.max_abs_g <= TOL_GRAD or step <= TOL_CHANGE or abs(losses[-1] - losses[-2]) < \
            TOL_CHANGE:
        return "gradient or step below tolerance"
    if stalled(losses):
        return (f"converged: loss fell by less than {STALL_TOL:g} (relative) in "
                f"{STALL_WINDOW} iterations")
    return ""
