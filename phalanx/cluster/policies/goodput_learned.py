"""``--policy goodput --profiles learned`` (the default): the goodput policy on the
information Pollux has (``learned.py``), no more.

Per job it knows the set-ups the job has run (GPUs, nodes, per-GPU batch -> step and sync
time), the throughput model fitted to them (the artifact's ``fit_perf_params``), and the
gradient statistics at its current batch and epoch; its predicted goodput on n GPUs
(packed on ``ceil(n / node GPUs)`` nodes) is the artifact's ``GoodputFunction.optimize``.
A job may grow to twice the most GPUs it has run on (ncf: one GPU, batch 32,768, as the
artifact runs it); a job never run is worth one GPU's speedup (1). Each job picks its own
batch for the GPUs it gets (``adapts_batch``), as under ``pollux``.

Allocation is ``goodput.greedy`` on value per added GPU. A job's value on n GPUs is
``w x speedup(n)`` (goodput over its own predicted 1-GPU goodput), times ``T / (T +
restart)`` when n is not what it holds. Weights ``w``: ``none`` 1, ``las`` 1 / (attained
GPU-s + 3600), ``srpt`` (the only one that reads remaining work, from the epochs users
declare) its 1-GPU goodput / remaining progress, so the value is 1 / remaining time; with
srpt T is the horizon or the job's remaining time if shorter, otherwise the horizon.

Options (``LearnedOptions``; ``--study pollux-ablation`` measures each): ``min_gain``
(default 0.1) asks a change to raise the job's value by this fraction beyond the restart
term, a hysteresis against reallocations the noisy learned model does not pay back (the
one change that helped); ``explore`` multiplies the speedup of GPU counts a job has not
run by ``1 + explore``; ``share`` fits one model per application over every job's
observations (a prior from similar jobs; a new job is then valued and sized by it);
``growth`` (Pollux: 2) caps a job at that many times the most GPUs it has run;
``multistart`` fits from overlap exponents 1, 2, 4, 8 and keeps the best;
``speedup_units`` values ``none`` / ``las`` in speedups instead of progress.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from phalanx.cluster.core.view import Choice, JobView
from phalanx.cluster.model.learned import Facts, Learner
from phalanx.cluster.policies.goodput import check_goodput_flags, greedy
from phalanx.errors import ConfigError


@dataclass(frozen=True)
class LearnedOptions:
    """The learned goodput policy's ablation switches (exploration, a shared model per
    application, minimum gain, units, growth, multistart)."""

    explore: float = 0.0
    share: bool = False
    min_gain: float = 0.1         # a change must raise the value by 10% (hysteresis)
    speedup_units: bool = False   # value none / las in speedup, not progress, units
    growth: float = 2.0           # may grow to growth x the most GPUs run (Pollux: 2)
    multistart: bool = False      # fit from several overlap exponents, keep the best

    def __post_init__(self) -> None:
        if not 1.0 <= self.growth < math.inf:
            raise ConfigError(f"goodput: growth must be a finite number >= 1, got "
                              f"{self.growth}")
        if not 0.0 <= self.explore < math.inf or not 0.0 <= self.min_gain < math.inf:
            raise ConfigError(f"--goodput-explore and --goodput-min-gain must be finite "
                              f"numbers >= 0, got {self.explore}, {self.min_gain}")


@dataclass
class LearnedGoodputPolicy:
    """The goodput policy on what Pollux knows: throughput fitted to the set-ups each job
    ran, gradient statistics at its batch. Used by the interval engine and the live elastic
    engine alike."""

    facts: Mapping[str, Facts]
    node_gpus: int = 4
    restart_s: float = 30.0
    horizon_s: float = 1800.0
    priority: str = "none"
    options: LearnedOptions = field(default_factory=LearnedOptions)
    name: str = "goodput"
    # (job id, GPUs) -> how much slower each step runs there for want of CPU cores (live
    # CPU jobs on a machine with more ranks than cores: ``core_share``); None: never
    slowdown: Callable[[int, int], float] | None = None
    adapts_batch: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        check_goodput_flags(self.priority, self.horizon_s)
        o = self.options
        self.learner = Learner(dict(self.facts), share=o.share, growth=o.growth,
                               gammas=(1.0 + 1e-3, 2.0, 4.0, 8.0) if o.multistart
                               else (1.0 + 1e-3,))

    @property
    def uses_remaining(self) -> bool:
        return self.priority == "srpt"

    def learner_for(self, device_type: str) -> Learner:
        return self.learner      # one model per job, whatever it runs on

    def finished(self, jid: int) -> None:
        """Nothing more than the learner's entry, which the engine's job forgets."""

    def _counts(self, cap: int) -> list[int]:
        small = list(range(1, min(self.node_gpus, cap) + 1))
        return small + list(range(2 * self.node_gpus, cap + 1, self.node_gpus))

    def _speedups(self, j: JobView, counts: list[int]) -> tuple[dict[int, float], float]:
        """Predicted speedup (goodput / 1-GPU goodput) at each count, and the 1-GPU
        goodput (0 when the job has not run: nothing is known of its speed)."""
        k = self.learner.knowledge(j.id, j.app)
        if k.params is None or k.grad is None:
            return {n: float(n) for n in counts}, 0.0
        n = np.array([1] + counts)
        g = k.goodput(-(-n // self.node_gpus), n)
        if self.slowdown is not None:
            g = g / np.array([self.slowdown(j.id, int(c)) for c in n])
        if not g[0] > 0:
            return {c: float(c) for c in counts}, 0.0
        seen = {key[1] for key in k.profile}
        out = {}
        for c, gc in zip(counts, g[1:]):
            s = gc / g[0]
            if c not in seen:
                s *= 1.0 + self.options.explore
            out[c] = float(s)
        return out, float(g[0])

    def allocate(self, jobs: Sequence[JobView], capacity: int, now: float, *,
                 held: Mapping[str, int] | None = None) -> dict[int, Choice]:
        allowed, speed, weight = {}, {}, {}
        for j in jobs:
            counts = self._counts(min(self.learner.cap(j.id, j.app), capacity))
            allowed[j.id] = counts
            speed[j.id], g1 = self._speedups(j, counts)
            # speedups x the job's 1-GPU goodput = its goodput in progress units
            scale = 1.0 if self.options.speedup_units else (g1 if g1 > 0 else math.nan)
            if self.priority == "srpt":
                weight[j.id] = g1 / max(j.remaining, 1e-9) if g1 > 0 else math.nan
            elif self.priority == "las":
                weight[j.id] = scale / (j.attained + 3600.0)
            else:
                weight[j.id] = scale
        known = [w for w in weight.values() if not math.isnan(w)]
        for jid, w in weight.items():
            if math.isnan(w):
                # a job never run: as valuable as the most valuable known job (its first
                # GPU is how its speed becomes known)
                weight[jid] = max(known, default=1.0)

        def value(j: JobView, n: int) -> float:
            if n == 0:
                return 0.0
            v = weight[j.id] * speed[j.id][n]
            if n != j.gpus:
                t = self.horizon_s
                if self.uses_remaining and weight[j.id] > 0:
                    # remaining time at n GPUs = remaining / goodput = 1 / value
                    t = min(t, 1.0 / v)
                v *= t / (t + self.restart_s) / (1.0 + self.options.min_gain)
            return v

        level = greedy(jobs, capacity, allowed, value)
        return {j.id: Choice(level[j.id], None) for j in jobs}
