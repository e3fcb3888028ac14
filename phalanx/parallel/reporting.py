"""Events and progress for the stage-parallel strategies (model parallel, pipeline, hybrid).

The stage that computes the loss logs ``train`` events; global rank 0 owns the progress
bar and logs ``eval`` events on the assembled model. Each process opens its own
:class:`EventLog` on the run's shared ``events.jsonl``.
"""

from __future__ import annotations

import time

from torch import nn

from phalanx.metrics import EventLog, Progress
from phalanx.parallel.base import Job, evaluate

LOG_EVERY = 10  # steps between "train" events (plus the first and the last step)


class StageReporter:
    def __init__(self, job: Job, rank: int, total: int, label: str, *, logs_loss: bool) -> None:
        cfg = job.config
        self.job, self.rank, self.total, self.logs_loss = job, rank, total, logs_loss
        tb = job.run_dir / "tensorboard" if cfg.tensorboard else None
        self.log = EventLog(job.run_dir / "events.jsonl", rank=rank, role="worker",
                            tensorboard_dir=tb if (logs_loss or rank == 0) else None)
        self.progress = Progress(total, label, enabled=cfg.progress and rank == 0)
        self.t0 = time.perf_counter()

    def wants_train_event(self, step: int) -> bool:
        return self.logs_loss and (step == 1 or step % LOG_EVERY == 0 or step == self.total)

    def train(self, step: int, epoch: int, loss: float, accuracy: float, samples: int,
              **extra: float) -> None:
        self.log.log("train", step=step, epoch=epoch, loss=loss, accuracy=accuracy,
                     samples=samples, wall_s=self.wall(), **extra)

    def tick(self, step: int) -> None:
        self.progress.update(step)

    def evaluate(self, model: nn.Module, step: int, epoch: int, samples: int) -> None:
        """On rank 0, after the stages' weights were gathered into ``model``."""
        loss, acc = evaluate(model, self.job.test)
        self.log.log("eval", step=step, epoch=epoch, samples=samples, test_loss=loss,
                     test_accuracy=acc, wall_s=self.wall())

    def wall(self) -> float:
        return time.perf_counter() - self.t0

    def close(self) -> None:
        self.progress.close()
        self.log.close()


def wants_eval(cfg, step: int, epoch_done: bool) -> bool:
    """Evaluate every ``eval_every`` steps, or at the end of each epoch when that is 0."""
    if cfg.eval_every:
        return not epoch_done and step % cfg.eval_every == 0
    return epoch_done
