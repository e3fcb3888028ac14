"""One training loop for every strategy: the counters, the cadences and gradient
accumulation live here; a strategy supplies :class:`Hooks`.

The split follows torchtitan's ``train`` / ``train_step`` / ``forward_backward_step``:

- :meth:`Loop.run` owns the step, micro-batch, sample and epoch counters and every cadence:
  the kill point (:meth:`Hooks.before_step`, at the first micro-batch of a step), the
  emulated straggler (on :meth:`Hooks.forward_backward`, never on :meth:`Hooks.fetch`'s
  data, pulls or locks), the ``train`` events with their divergence check, the
  evaluations (every ``--eval-every`` steps, or at each epoch's end), the checkpoints
  (every ``--checkpoint-every`` steps, and the final one where the strategy keeps one), and
  the preemption point (a scheduler's SIGTERM: checkpoint, then
  :class:`~phalanx.runtime.preempt.Preempted`, where :meth:`Hooks.can_stop_after` allows).
- **Gradient accumulation is written once**: ``--grad-accum`` micro-batches make a step;
  each one's backward runs on its loss times :attr:`Loop.loss_scale` (``1/grad_accum``,
  exactly 1 without accumulation) so ``.grad`` sums to the mean of the micro-batches'
  gradients; :meth:`Hooks.apply_update` then reduces / exchanges and applies the update
  once.
  A pipeline's schedule runs its own backward: it scales the summed gradient by the same
  :attr:`Loop.loss_scale` (over its micro-batches too).
- A strategy's hooks: :meth:`Hooks.fetch` (the batch and what must arrive before it is
  computed on), :meth:`Hooks.forward_backward` (one micro-batch, including its
  communication overlapped with backward), :meth:`Hooks.apply_update` (exchange + update;
  returns the extras of the ``train`` event), and optionally :meth:`Hooks.before_step`,
  :meth:`Hooks.evaluate` (a collective for the stage strategies, a pull for the parameter
  server) and :meth:`Hooks.checkpoint`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from phalanx.config import RunConfig
from phalanx.data import Dataset, epoch_batches, steps_per_epoch
from phalanx.parallel.base import Straggler
from phalanx.parallel.divergence import check_loss
from phalanx.parallel.precision import FP32, Precision
from phalanx.parallel.worker import StepReporter, batch_accuracy, wants_eval
from phalanx.runtime import preempt


@dataclass
class Position:
    """Where a run stands: optimizer steps, the epoch, this rank's samples, averaging
    rounds (local SGD) and the wall clock (a resumed run's clock continues from it)."""

    step: int = 0
    epoch: int = 0
    samples: int = 0
    rounds: int = 0
    wall_s: float = 0.0


@dataclass
class Micro:
    """What one micro-batch's forward and backward hand the loop. ``loss`` None: this rank
    computes no loss (a stage before the last)."""

    samples: int
    loss: torch.Tensor | float | None = None
    out: torch.Tensor | None = None
    y: torch.Tensor | None = None


class Hooks:
    """A strategy's part of the loop. ``forward_backward`` and ``apply_update`` are required."""

    model: nn.Module | None = None  # evaluated by the default :meth:`evaluate`
    test: Dataset | None = None

    def before_step(self, step: int) -> None:
        """At the first micro-batch of optimizer step ``step + 1``: the kill point, a pull,
        a buffer broadcast."""

    def fetch(self, idx: torch.Tensor, first: bool) -> Any:
        """The micro-batch ``idx`` ready to compute on, outside the straggler's clock: the
        data on the device, and what must arrive first (a pull, a locked snapshot).
        ``first``: the step's first micro-batch. Default: the indices themselves."""
        return idx

    def forward_backward(self, batch: Any, scale: float, last: bool) -> Micro:
        """One micro-batch (what :meth:`fetch` returned): forward, loss,
        ``(loss * scale).backward()`` (so ``.grad`` accumulates the step's mean). ``last``:
        the step's last micro-batch (a reducer that overlaps backward synchronises on
        it)."""
        raise NotImplementedError

    def apply_update(self, step: int) -> dict[str, Any]:
        """Exchange and apply the update for optimizer step ``step`` (1-based) and clear
        the gradients. Returns the ``train`` event's extras; ``loss`` / ``accuracy`` in it
        replace the last micro-batch's (a pipeline's all-replica mean)."""
        raise NotImplementedError

    def evaluate(self, report: StepReporter, step: int, epoch: int, samples: int) -> None:
        """An evaluation is due on every rank; by default the evaluating rank scores its
        model (the stage strategies gather theirs first, a parameter-server worker pulls)."""
        if report.evaluates and self.model is not None and self.test is not None:
            report.evaluate(self.model, self.test, step, epoch, samples)

    def checkpoint(self, pos: Position, final: bool) -> None:
        """Every ``--checkpoint-every`` steps and at the last (``final``)."""

    def can_stop_after(self, step: int) -> bool:
        """May a scheduler's SIGTERM stop the run after ``step`` (its checkpoint then holds
        everything to resume)? Default: never (the strategy cannot resume)."""
        return False


class Loop:
    """Runs ``hooks`` over ``batches`` ((epoch, indices) micro-batches) until ``total``
    optimizer steps. ``shards``: ranks drawing distinct batches at this one's pace (an
    evaluation's and the outcome's samples are this rank's times that); ``straggler``: the
    compute of each micro-batch is slowed by it (None: the hooks time their own compute,
    e.g. a stage that excludes its waits)."""

    def __init__(self, cfg: RunConfig, report: StepReporter, hooks: Hooks,
                 batches: Iterable[tuple[int, torch.Tensor]], total: int, *,
                 start: Position | None = None, shards: int = 1,
                 straggler: Straggler | None = None) -> None:
        self.cfg, self.report, self.hooks, self.total = cfg, report, hooks, total
        self.batches, self.shards, self.straggler = batches, shards, straggler
        self.pos = Position(**vars(start)) if start is not None else Position()
        self.accum = cfg.grad_accum
        self.loss_scale = 1.0 / self.accum

    def run(self) -> Position:
        """Train; returns where the run stopped (``epoch``: the last epoch trained in)."""
        pos, hooks, report = self.pos, self.hooks, self.report
        micro = pos.step * self.accum
        for epoch, idx in self.batches:
            if pos.step >= self.total:
                break  # resumed from the final checkpoint: nothing left to do
            if epoch != pos.epoch:
                self._evaluate(pos.epoch + 1, epoch_ended=True)
                pos.epoch = epoch
            first = micro % self.accum == 0
            if first:
                hooks.before_step(pos.step)
            batch = hooks.fetch(idx, first)
            micro += 1
            mb = self._forward_backward(batch, last=micro % self.accum == 0)
            pos.samples += mb.samples
            if micro % self.accum:
                continue  # accumulate in .grad; the step comes on the last micro-batch
            extra = hooks.apply_update(pos.step + 1) or {}
            pos.step += 1
            pos.rounds = int(extra.get("rounds", pos.rounds))
            self._report(mb, extra)
            if wants_eval(self.cfg, pos.step, epoch_done=False):
                self._evaluate(pos.epoch, epoch_ended=False)
            every = self.cfg.checkpoint_every
            final = pos.step == self.total
            # a scheduler's SIGTERM (runtime/preempt): every rank agrees on this step
            stop = not final and hooks.can_stop_after(pos.step) and preempt.agreed()
            if final or stop or (every and pos.step % every == 0):
                pos.wall_s = report.wall()
                hooks.checkpoint(pos, final)
            if stop:
                raise preempt.Preempted(pos.step)
            if final:
                break
        self._evaluate(pos.epoch + 1, epoch_ended=True)
        report.close()
        return pos

    def _forward_backward(self, batch: Any, last: bool) -> Micro:
        if self.straggler is None:
            return self.hooks.forward_backward(batch, self.loss_scale, last)
        self.straggler.start()
        mb = self.hooks.forward_backward(batch, self.loss_scale, last)
        self.straggler.finish()
        return mb

    def _report(self, mb: Micro, extra: dict[str, Any]) -> None:
        pos, report = self.pos, self.report
        loss = extra.pop("loss", mb.loss)
        accuracy = extra.pop("accuracy", None)
        if loss is None or not report.wants_train(pos.step):
            report.tick(pos.step)
            return
        value = loss.item() if isinstance(loss, torch.Tensor) else float(loss)
        check_loss(self.cfg, value, pos.step)  # NaN / inf: stop now, in one line
        if accuracy is None:
            accuracy = batch_accuracy(mb.out, mb.y) if mb.out is not None else float("nan")
        report.train(pos.step, pos.epoch, value, float(accuracy), pos.samples, **extra)

    def _evaluate(self, epoch: int, epoch_ended: bool) -> None:
        if wants_eval(self.cfg, self.pos.step, epoch_ended):
            self.hooks.evaluate(self.report, self.pos.step, epoch, self.pos.samples * self.shards)


Batch = tuple[torch.Tensor, torch.Tensor]


def backward(model: nn.Module, loss_fn: nn.Module, batch: Batch, scale: float,
             precision: Precision = FP32) -> Micro:
    """The usual ``forward_backward``: forward (under ``precision``'s autocast), loss, and
    backward on the loss times ``scale`` (skipped at exactly 1, so a run without
    accumulation is bit for bit the plain loop's)."""
    x, y = batch
    with precision.autocast(x.device):
        out = model(x)
    loss = loss_fn(out, y)  # outside autocast: the loss in fp32 (the logits cast up)
    (loss * scale if scale != 1.0 else loss).backward()
    return Micro(len(y), loss, out, y)


def batch_stream(shard: torch.Tensor, batch_size: int, seed: int, *, per_epoch: int = 0,
                 skip: int = 0) -> Iterator[tuple[int, torch.Tensor]]:
    """(epoch, indices) of a rank's micro-batches, forever, after the first ``skip`` (taken
    before a checkpoint or a crash). ``per_epoch``: batches per epoch (0: the shard's
    full batches; data-parallel workers take the smallest shard's so their collectives
    stay matched). The order depends only on (seed, epoch), so a resumed run continues the
    same trajectory; whole epochs are skipped without drawing their permutations."""
    per_epoch = per_epoch or steps_per_epoch(len(shard), batch_size)
    first = skip // per_epoch if per_epoch else 0

    def batches() -> Iterator[tuple[int, torch.Tensor]]:
        for e in itertools.count(first):
            for i, idx in enumerate(epoch_batches(shard, batch_size, e, seed)):
                if i == per_epoch:
                    break
                yield e, idx

    return itertools.islice(batches(), skip - first * per_epoch, None)
