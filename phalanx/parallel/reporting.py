"""Events and progress for the stage-parallel strategies (model parallel, pipeline, hybrid).

The stage that computes the loss logs ``train`` events (at step 1 too: these runs are
short); global rank 0 owns the progress bar and logs ``eval`` events on the assembled
model. Each process opens its own :class:`EventLog` on the run's shared ``events.jsonl``.
The reporting itself is every strategy's :class:`~phalanx.parallel.worker.StepReporter`.
"""

from __future__ import annotations

from phalanx.metrics import EventLog
from phalanx.parallel.base import Job
from phalanx.parallel.worker import StepReporter


class StageReporter(StepReporter):
    def __init__(self, job: Job, rank: int, total: int, label: str, *, logs_loss: bool) -> None:
        cfg = job.config
        self.test = job.test  # what rank 0 evaluates the gathered model on
        tb = job.run_dir / "tensorboard" if cfg.tensorboard else None
        log = EventLog(job.run_dir / "events.jsonl", rank=rank, role="worker",
                       tensorboard_dir=tb if (logs_loss or rank == 0) else None)
        super().__init__(cfg, log, total, label, shows_progress=rank == 0,
                         evaluates=rank == 0, logs_loss=logs_loss, first=True)

    def close(self) -> None:
        super().close()
        self.log.close()

