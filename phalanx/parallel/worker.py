"""What every strategy's worker sets up the same way, and how it reports its steps.

:class:`WorkerKit`: the augmentation generator (seed + 1 + the rank's data index, so a
single worker, a sync replica and a pipeline's loss stage draw the same as the loop they
are compared with), the loss, the emulated straggler and the augmentation.
:class:`StepReporter`: ``train`` events every :data:`LOG_EVERY` optimizer steps and at the
last, the progress bar on one rank, and ``eval`` events when they are due (every
``--eval-every`` steps, or at each epoch's end when it is 0). docs/events.md defines the
events.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from phalanx.config import TEXT_SETS, RunConfig
from phalanx.data import Dataset
from phalanx.metrics import EventLog, Progress
from phalanx.metrics.progress import say
from phalanx.models.loss import TokenCrossEntropy, logits_of
from phalanx.parallel.base import Straggler, augmenter, ctr_figures, evaluate
from phalanx.parallel.precision import precision_of
from phalanx.runtime.supervise import launch_marks

LOG_EVERY = 10  # optimizer steps between "train" events (plus the last step)


@dataclass
class WorkerKit:
    gen: torch.Generator
    loss_fn: nn.Module
    straggler: Straggler
    aug: Callable | None

    @classmethod
    def of(cls, cfg: RunConfig, data_rank: int, compute_rank: int | None = None) -> WorkerKit:
        """``data_rank``: which stream of augmentation draws this rank takes (its data
        shard's index; 0 where every rank sees the same batches); ``compute_rank``: the
        rank ``--slow-workers`` names (default: ``data_rank``)."""
        rank = data_rank if compute_rank is None else compute_rank
        return cls(torch.Generator().manual_seed(cfg.seed + 1 + data_rank),
                   TokenCrossEntropy(), Straggler(cfg.slow_workers.get(rank, 1.0)),
                   augmenter(cfg))


def tokens_per_sample(cfg: RunConfig) -> int:
    """Tokens a training sample holds: a text window's context; 0 for anything else."""
    return cfg.context if cfg.data in TEXT_SETS else 0


def lm_figures(test: Dataset, loss: float) -> dict[str, float]:
    """What a language model's evaluation adds: perplexity, e^(loss per token)."""
    if test.task != "lm":
        return {}
    return {"test_perplexity": math.exp(loss) if loss < 700 else math.inf}


def wants_eval(cfg: RunConfig, step: int, epoch_done: bool) -> bool:
    """Is an evaluation due: every ``--eval-every`` steps, or at the end of each epoch when
    that is 0. (The stage strategies ask on every rank: gathering the model is a
    collective.)"""
    if cfg.eval_every:
        return not epoch_done and step % cfg.eval_every == 0
    return epoch_done


def batch_accuracy(out: torch.Tensor, y: torch.Tensor) -> float:
    """Right predictions over all of them (samples, or a language model's tokens)."""
    return (logits_of(out, y).argmax(-1) == y).float().mean().item()


class StepReporter:
    """One rank's ``train`` / ``eval`` events and (on one rank) its progress bar.

    ``evaluates``: this rank writes ``eval`` events (rank 0 in most strategies);
    ``first``: a ``train`` event at step 1 too (the stage strategies, whose runs are short);
    ``t0``: when the run's clock started (a resumed run passes its elapsed time back);
    ``shards``: ranks drawing distinct batches at this one's pace (the bar's samples/s is
    this rank's times that: the run's, for data-parallel workers)."""

    def __init__(self, cfg: RunConfig, log: EventLog, total: int, label: str, *,
                 shows_progress: bool, evaluates: bool, logs_loss: bool = True,
                 first: bool = False, t0: float | None = None, shards: int = 1) -> None:
        self.cfg, self.log, self.total = cfg, log, total
        self.evaluates, self.logs_loss, self.first = evaluates, logs_loss, first
        self.shards = shards
        if cfg.progress and log.rank >= 0:  # a start-up phase line per process
            say(f"{label}: rank {log.rank} ({log.role}) ready")
        self.progress = Progress(total, label, enabled=cfg.progress and shows_progress,
                                 tokens_per_sample=tokens_per_sample(cfg))
        self.t0 = time.perf_counter() if t0 is None else t0
        # this rank is set up (process, data, groups): its training starts now
        log.log("ready", label=label, **launch_marks())  # + its start-up points

    def wall(self) -> float:
        return time.perf_counter() - self.t0

    def wants_train(self, step: int) -> bool:
        return self.logs_loss and (step % LOG_EVERY == 0 or step == self.total
                                   or (self.first and step == 1))

    def train(self, step: int, epoch: int, loss: torch.Tensor | float, accuracy: float,
              samples: int, **extra: float) -> None:
        """``samples``: this rank's own (docs/events.md). ``loss``'s ``.item()`` is a
        device sync on a GPU: paid only when an event is written."""
        value = loss.item() if isinstance(loss, torch.Tensor) else float(loss)
        self.log.log("train", step=step, epoch=epoch, loss=value, accuracy=accuracy,
                     samples=samples, wall_s=self.wall(), **extra)
        self.progress.update(step, samples=samples * self.shards, epoch=epoch, loss=value)

    def step(self, step: int, epoch: int, loss: torch.Tensor, out: torch.Tensor,
             y: torch.Tensor, samples: int, **extra: float) -> bool:
        """A ``train`` event if one is due at ``step``; returns whether it wrote one."""
        if not self.wants_train(step):
            return False
        self.train(step, epoch, loss, batch_accuracy(out, y), samples, **extra)
        return True

    def tick(self, step: int) -> None:
        self.progress.update(step)

    def eval_due(self, step: int, epoch_ended: bool) -> bool:
        return self.evaluates and wants_eval(self.cfg, step, epoch_ended)

    def evaluate(self, model: nn.Module, test: Dataset, step: int, epoch: int,
                 samples: int) -> None:
        """An ``eval`` event for ``model`` (``samples``: the run's total so far)."""
        loss, acc = evaluate(model, test, precision=precision_of(self.cfg))
        lm = lm_figures(test, loss)
        self.log.log("eval", step=step, epoch=epoch, samples=samples, test_loss=loss,
                     test_accuracy=acc, wall_s=self.wall(), **lm, **ctr_figures(model, test))
        self.progress.update(step, test_acc=acc, **({"test_loss": loss} if lm else {}))

    def maybe_eval(self, model: nn.Module, test: Dataset, step: int, epoch: int,
                   samples: int, epoch_ended: bool) -> None:
        if self.eval_due(step, epoch_ended):
            self.evaluate(model, test, step, epoch, samples)

    def close(self) -> None:
        self.progress.close()
