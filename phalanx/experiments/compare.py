"""``phalanx compare``: the same model, data, seed and budget under several strategies,
then one report (Markdown table + PNG plots) that answers "which protocol, at what cost?"."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from phalanx.config import RunConfig
from phalanx.data import DATASETS
from phalanx.errors import ConfigError
from phalanx.experiments.runs import StrategyRun
from phalanx.experiments.seeds import run_seeded, write_seeded_report
from phalanx.parallel.registry import (
    NAMES,
    RULE_DEFAULT,
    check_config,
    option_owners,
    spec,
)

__all__ = ["StrategyRun", "compare", "parse_strategies", "plan_evals", "strategy_config"]


def parse_strategies(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise ConfigError("--strategies: give at least one strategy, e.g. single,sync,asp")
    for name in names:
        if name not in NAMES:
            raise ConfigError(f"--strategies: {name!r} is not one of {', '.join(NAMES)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"--strategies: {text!r} names a strategy twice")
    return names


# a comparison's budget in passes below which a full-batch strategy (L-BFGS: the first pass
# evaluates the start, each iteration at least one more) cannot train. Measured (mlp,
# synthetic, 1,024 samples, 2 workers): 3 and 4 passes end at test accuracy 0.18 and 0.24
# (2 and 3 iterations), 5 passes at 0.80, 8 at 0.91
FULL_BATCH_MIN_PASSES = 5


def strategy_config(base: RunConfig, strategy: str, out: Path,
                    overrides: dict[str, Any] | None = None, *,
                    own_rule: bool | None = None) -> RunConfig:
    """The base configuration with one strategy swapped in (single runs one worker).
    ``own_rule``: the user named neither --rule nor --lr, so each strategy trains with its
    own default rule (``StrategySpec.default_rule``; default: read from ``base``)."""
    if own_rule is None:
        own_rule = uses_default_rule(base)
    cfg = dataclasses.replace(base, strategy=strategy, out=str(out), progress=False)
    if own_rule:
        cfg.lr, cfg.rule = None, RULE_DEFAULT  # check_config below applies the strategy's
    if cfg.threads == 0:
        cfg.threads = 1  # every process of every strategy gets one core's worth: a fair race
    s = spec(strategy)
    if s.fixed_workers:
        cfg.workers = s.fixed_workers
        cfg.slow_workers = {}
    if s.default_lr is not None:
        cfg.lr = s.default_lr  # e.g. L-BFGS: --lr scales its step (natural value 1)
    # settings other strategies own go back to their defaults (e.g. Downpour's fetch/push
    # knobs in a comparison that includes downpour)
    for name, owners in option_owners().items():
        if strategy not in owners:
            setattr(cfg, name, RunConfig.__dataclass_fields__[name].default)
    for key, value in (overrides or {}).items():
        setattr(cfg, key, value)
    if cfg.softsync > cfg.workers:
        cfg.softsync = cfg.workers
    cfg = check_config(cfg)  # (a full-batch strategy's own default passes applied here)
    own_budget = any(k in (overrides or {}) for k in ("epochs", "max_steps"))
    if s.full_batch and not own_budget and not cfg.max_steps \
            and math.ceil(cfg.epochs) < FULL_BATCH_MIN_PASSES:
        raise ConfigError(f"--epochs {cfg.epochs:g}: {strategy} gets {math.ceil(cfg.epochs)} "
                          f"full-batch passes (at most {math.ceil(cfg.epochs) - 1} L-BFGS "
                          f"iterations), too few to train; give --epochs >= "
                          f"{FULL_BATCH_MIN_PASSES} or leave {strategy} out")
    return check_config(plan_evals(cfg))  # planned on the checked budget


def uses_default_rule(cfg: RunConfig) -> bool:
    """Did the user leave both --rule and --lr to the defaults (``cfg`` as written, not
    checked)?"""
    return cfg.lr is None and cfg.rule == RULE_DEFAULT


def plan_evals(cfg: RunConfig, points: int = 8) -> RunConfig:
    """Unless the user chose, evaluate about ``points`` times per run, so accuracy curves
    have a shape (``eval_every`` counts per-worker steps)."""
    if cfg.eval_every == 0 and cfg.max_steps == 0:
        per_worker_steps = cfg.epochs * base_train_size(cfg) / (cfg.workers * cfg.batch_size)
        if spec(cfg.strategy).full_batch:  # an L-BFGS evaluation is one pass over the data
            per_worker_steps = cfg.epochs
        cfg.eval_every = max(1, int(per_worker_steps / points))
    return cfg


def base_train_size(cfg: RunConfig) -> int:
    """Training-set size without loading it (known sets), for planning evaluations."""
    size = DATASETS.get(cfg.data).train_size  # an unknown name: one line, no guess
    return min(size, cfg.train_limit) if cfg.train_limit else size


def lm_setup(cfg: RunConfig) -> str:
    """For text data, what a run's budget is in tokens (a sample is ``context`` tokens)."""
    if DATASETS.get(cfg.data).task != "lm":
        return ""
    windows = cfg.epochs * base_train_size(cfg)
    return (f" Text: windows of {cfg.context} {cfg.tokens} tokens, about "
            f"{windows * cfg.context:,.0f} training tokens per run (all workers together); "
            "validation loss in nats per token on the held-out last 10% of the text"
            + (f" (its first {cfg.test_limit} windows)" if cfg.test_limit else "") + ".")


def compare(base: RunConfig, strategies: Sequence[str], out: Path, *, target: float = 0.8,
            command: str = "", seeds: Sequence[int] | None = None,
            reuse: bool = False, preamble: str = "",
            overrides: Mapping[str, dict[str, Any]] | None = None) -> tuple[Any, Path]:
    """Every strategy once per seed (default: the base seed); returns the
    :class:`~phalanx.experiments.seeds.SeededRuns` and the report's path. ``overrides``:
    strategy -> settings only that strategy's runs change (a study's own sizes, e.g. the
    passes of L-BFGS); ``preamble``: text the report opens with (a study's verdict)."""
    seeds = list(seeds) if seeds else [base.seed]
    own = uses_default_rule(base)
    for s in strategies:  # every configuration checked before the first run starts
        strategy_config(base, s, out / s, (overrides or {}).get(s), own_rule=own)
    out.mkdir(parents=True, exist_ok=True)
    runs = run_seeded(lambda seed, folder: [
        (s, strategy_config(dataclasses.replace(base, seed=seed), s, folder / s,
                            (overrides or {}).get(s), own_rule=own))
        for s in strategies], out, seeds, reuse=reuse)
    desc = (f"Model `{base.model}` on `{base.data}`, {base.epochs:g} epoch(s), batch "
            f"{base.batch_size} per worker, "
            + (f"rule `{base.rule}` (lr {base.lr}), " if base.lr is not None else
               f"rule `{base.rule}` at its default lr, " if not own else
               "each strategy's default rule and learning rate (docs/defaults.md), ")
            + f"{base.workers} workers for the multi-worker strategies, one intra-op thread per "
            "process"
            + (f", slow workers {base.slow_workers}" if base.slow_workers else "") + "."
            + lm_setup(base))
    report = write_seeded_report(runs, out, title="Strategy comparison", target=target,
                                 preamble=(preamble + "\n\n" if preamble else "") + desc,
                                 command=command)
    return runs, report
