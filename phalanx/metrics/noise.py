"""What a job tells its scheduler about itself: its step and sync times at its current
set-up, and the gradient noise scale (McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training", appendix A.1), from gradients the workers already have.

**The two-batch-size estimator.** With the true gradient G and the per-sample covariance
trace S = tr(Sigma), a gradient averaged over B samples has E|G_B|^2 = |G|^2 + S / B. Two
batch sizes give two equations:

    |G|^2 ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    S     ~ (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

In synchronous data parallel both are at hand every step: one worker's own micro-batch
gradient (B_small = the per-worker micro-batch, seen by a tensor hook before the allreduce
averages it) and the averaged gradient every worker applies (B_big = micro-batch x
accumulation x workers). Each estimate is unbiased but noisy, so -- as McCandlish et al.
do -- the two quantities are averaged separately (an exponential moving average) and the
noise scale B_noise = S / |G|^2 is their ratio. Pollux's ``(sqr, var)`` are ``|G|^2`` and
``S / init_batch``.

One rank (rank 0) measures, every ``every`` steps; the cost is one squared norm of the
gradient on that step. It writes ``perf`` events (``step_s``, ``sync_s`` per step over the
last window, workers, per-worker batch) and ``noise`` events (``g2``, ``s``, ``b_noise``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from phalanx.metrics.events import EventLog


def two_batch_estimate(g2_small: float, g2_big: float, b_small: float, b_big: float
                       ) -> tuple[float, float]:
    """(|G|^2, S) from the squared norms of gradients averaged over ``b_small`` and
    ``b_big`` samples (``b_big > b_small``)."""
    if not b_big > b_small > 0:
        raise ValueError(f"need b_big > b_small > 0, got {b_big}, {b_small}")
    g2 = (b_big * g2_big - b_small * g2_small) / (b_big - b_small)
    s = (g2_small - g2_big) / (1.0 / b_small - 1.0 / b_big)
    return g2, s


@dataclass
class NoiseScale:
    """Moving averages of the two estimates (McCandlish et al.'s smoothing)."""

    decay: float = 0.9
    g2: float = math.nan
    s: float = math.nan

    def add(self, g2: float, s: float) -> None:
        if math.isnan(self.g2):
            self.g2, self.s = g2, s
        else:
            d = self.decay
            self.g2 = d * self.g2 + (1 - d) * g2
            self.s = d * self.s + (1 - d) * s

    @property
    def b_noise(self) -> float:
        """S / |G|^2 (nan until both are positive: early estimates can be negative)."""
        return self.s / self.g2 if self.g2 > 0 and self.s > 0 else math.nan


class JobProbe:
    """Measures one rank's step/sync times and the noise scale; logs them every ``every``
    steps. ``params``: the parameters whose gradients are averaged; ``micro_batch``: the
    samples of one worker's micro-batch; ``per_step``: micro-batches averaged into one
    step over all workers (accumulation x workers)."""

    def __init__(self, params: Sequence[torch.Tensor], micro_batch: int, per_step: int,
                 workers: int, log: EventLog, active: bool = True, every: int = 10) -> None:
        # one rank measures (rank 0); the others hold an inactive probe: no hooks, no logs
        self.every = every if active else 0
        self.params, self.log = list(params), log
        self.b_small, self.b_big = float(micro_batch), float(micro_batch * per_step)
        self.workers, self.micro_batch = workers, micro_batch
        self.scale = per_step // workers     # accumulation: the hook sees g / accum
        self.noise = NoiseScale()
        self._armed = False
        self._g2_small = 0.0
        self._mark: tuple[int, float, float] | None = None
        self._hooks = [p.register_hook(self._hook) for p in self.params] \
            if per_step > 1 and self.every else []

    def _hook(self, g: torch.Tensor) -> torch.Tensor:
        if self._armed:
            self._g2_small += float(g.detach().float().pow(2).sum())
        return g

    def arm(self, next_step: int, last_micro: bool) -> None:
        """Before a backward: measure it (the last micro-step of a measured step)?"""
        self._armed = bool(self.every and last_micro and next_step % self.every == 0)
        self._g2_small = 0.0

    def step(self, step: int, sync_wait_s: float) -> None:
        """After step ``step`` is applied, while ``p.grad`` still holds the averaged
        gradient; ``sync_wait_s``: the loop's total time blocked on gradient sync so far."""
        if not self.every:
            return
        now = time.perf_counter()
        if self._armed and self._hooks:
            g2_big = sum(float(p.grad.detach().float().pow(2).sum()) for p in self.params
                         if p.grad is not None)
            g2_small = self._g2_small * self.scale ** 2
            g2, s = two_batch_estimate(g2_small, g2_big, self.b_small, self.b_big)
            self.noise.add(g2, s)
            self.log.log("noise", step=step, g2=self.noise.g2, s=self.noise.s,
                         b_noise=self.noise.b_noise, b_small=self.b_small, b_big=self.b_big)
        self._armed = False
        if step % self.every:
            return
        if self._mark is not None:
            s0, t0, w0 = self._mark
            n = step - s0
            self.log.log("perf", step=step, step_s=(now - t0) / n,
                         sync_s=(sync_wait_s - w0) / n, workers=self.workers,
                         batch=self.micro_batch)
        self._mark = (step, now, sync_wait_s)

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
