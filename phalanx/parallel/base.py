"""What every strategy shares: the job it runs, the outcome it returns, the step helpers."""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from phalanx.config import RunConfig
from phalanx.data import Dataset, parse_augment, shard_indices, steps_per_epoch
from phalanx.metrics.ranking import auc
from phalanx.models.loss import correct, token_cross_entropy
from phalanx.parallel.blocks import name_blocks
from phalanx.parallel.precision import FP32, Precision
from phalanx.parallel.recompute import checkpoint_blocks
from phalanx.runtime.checkpoint import load_checkpoint, save_checkpoint
from phalanx.runtime.exits import Death, merge_losses, seen_by

ModelFactory = Callable[[], nn.Module]


@dataclass
class Job:
    """A model factory, the data and the run configuration.

    ``model_fn`` must be picklable (a top-level function or ``functools.partial``) when
    the strategy starts processes. Every process calls it after ``torch.manual_seed(seed)``
    so all of them start from the same weights.
    """

    config: RunConfig
    model_fn: ModelFactory
    train: Dataset
    test: Dataset
    run_dir: Path

    def build_model(self) -> nn.Module:
        torch.manual_seed(self.config.seed)
        model = self.model_fn()
        if self.config.split_at:  # the block list stages, units and recomputation cut at
            name_blocks(model, self.config.split_at)
        if self.config.activation_checkpoint:
            checkpoint_blocks(model, self.config.activation_checkpoint,
                              f"--model {self.config.model}")
        return model

    def shard(self, rank: int, world: int) -> torch.Tensor:
        cfg = self.config
        return shard_indices(self.train.y, rank, world, cfg.seed, cfg.non_iid)

    def planned_steps(self, shard_size: int, batch_size: int | None = None) -> int:
        """Optimizer steps a worker takes: epochs x steps per epoch, capped by max_steps."""
        cfg = self.config
        per_epoch = steps_per_epoch(shard_size, batch_size or cfg.batch_size) // cfg.grad_accum
        steps = max(1, math.ceil(cfg.epochs * per_epoch))
        return min(steps, cfg.max_steps) if cfg.max_steps else steps


@dataclass
class Outcome:
    """What a strategy hands back: the trained model and the numbers for summary.json.

    ``stats``: the strategy's statistics, a dataclass (turned into a dict only when the
    summary is written) or, as read back from a result file, a dict."""

    model: nn.Module
    train_samples: int
    steps: int
    stats: Any = None

    def stats_dict(self) -> dict[str, Any]:
        return stats_dict(self.stats)


def stats_dict(stats: Any) -> dict[str, Any]:
    """A strategy's statistics as the dict a summary holds."""
    if stats is None:
        return {}
    if dataclasses.is_dataclass(stats) and not isinstance(stats, type):
        return dataclasses.asdict(stats)
    return dict(stats)


def augmenter(cfg: RunConfig):
    return parse_augment(cfg.augment)


@torch.no_grad()
def evaluate(model: nn.Module, data: Dataset, batch: int = 2000,
             precision: Precision = FP32) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) over a whole data set, in eval mode: per sample, or
    per token for a language model (every position of every window is one prediction).
    The forward runs under ``precision``'s autocast, as in training; the loss in fp32."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total_loss, right, scored = 0.0, 0, 0
    for start in range(0, len(data), batch):
        x = data.x[start : start + batch].to(device)
        y = data.y[start : start + batch].to(device)
        with precision.autocast(device):
            out = model(x)
        total_loss += token_cross_entropy(out, y, reduction="sum").item()
        right += correct(out, y).item()
        scored += y.numel()
    model.train(was_training)
    n = max(scored, 1)
    return total_loss / n, right / n


@torch.no_grad()
def ctr_figures(model: nn.Module, data: Dataset, batch: int = 4000) -> dict[str, float]:
    """What a click model's evaluation adds to the log-loss: the test AUC of its click
    logit (empty for any other task)."""
    if data.task != "ctr":
        return {}
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    logits = [model(data.x[s : s + batch].to(device))[:, 1].cpu()
              for s in range(0, len(data), batch)]
    model.train(was_training)
    return {"test_auc": auc(torch.cat(logits), data.y)}


STRAGGLER_WINDOW = 9   # compute phases whose median a straggler's sleep scales


class Straggler:
    """Emulates a slow device: after each compute phase, sleep (factor - 1) x the median of
    the last :data:`STRAGGLER_WINDOW` phases' durations (this one's included). The median,
    not this phase alone: a phase the OS held up for 0.3 s would otherwise make a rank
    45x slower sleep 13 s, a stall no slower device shows (and its peers' timeouts fire)."""

    def __init__(self, factor: float = 1.0) -> None:
        self.factor = factor
        self._t = 0.0
        self._recent: collections.deque[float] = collections.deque(maxlen=STRAGGLER_WINDOW)

    def start(self) -> None:
        self._t = time.perf_counter()

    def finish(self) -> None:
        if self.factor > 1.0:
            self._recent.append(time.perf_counter() - self._t)
            time.sleep((self.factor - 1.0) * statistics.median(self._recent))


def detached(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [p.detach() for p in params]




# ---- handing results from worker processes back to the driver ---------------------------

RESULT_FILE = "final_model.pt"


def write_result(job: Job, model_state: dict[str, torch.Tensor], *, train_samples: int,
                 steps: int, stats: Any = None) -> None:
    """Called by the process that holds the final model (usually rank 0)."""
    save_checkpoint(job.run_dir / RESULT_FILE, {
        "model": {k: v.detach().cpu() for k, v in model_state.items()},
        "train_samples": int(train_samples),
        "steps": int(steps),
        "stats": stats_dict(stats),
    })


def with_deaths(outcome: Outcome, deaths: list[Death], *, first_worker: int,
                seer: str = "server") -> Outcome:
    """``outcome`` with the workers the driver saw die (``deaths``: worker ``w`` is the
    process of rank ``first_worker + w``) merged into its ``worker_losses`` / ``workers_lost``
    beside those the servers (``seer``) dropped: one entry per worker, never two lists that
    disagree (runtime/exits.py)."""
    stats = outcome.stats_dict()
    driver = {d.rank - first_worker: d for d in deaths if d.rank >= first_worker}
    losses = merge_losses(seen_by(stats.get("worker_losses", []), seer), driver, seer=seer)
    stats.update(workers_lost=[e["worker"] for e in losses], worker_losses=losses)
    return dataclasses.replace(outcome, stats=stats)


def read_result(job: Job) -> Outcome:
    """Called by the driver after the processes joined."""
    payload = load_checkpoint(job.run_dir / RESULT_FILE)
    model = job.build_model()
    model.load_state_dict(payload["model"])
    return Outcome(model, payload["train_samples"], payload["steps"], payload["stats"])
