"""``phalanx compare``: the same model, data, seed and budget under several strategies,
then one report (Markdown table + PNG plots) that answers "which protocol, at what cost?"."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.config import STRATEGIES, RunConfig
from phalanx.errors import ConfigError
from phalanx.metrics import plots

SINGLE_PROCESS = ("single",)


@dataclass
class StrategyRun:
    """One strategy's outcome, read back from its run folder."""

    label: str
    summary: dict[str, Any]
    evals: list[dict[str, Any]]  # eval events: wall_s, samples, test_accuracy

    def time_to(self, target: float) -> float | None:
        for e in self.evals:
            if e.get("test_accuracy", 0.0) >= target:
                return float(e["wall_s"])
        return None

    def samples_to(self, target: float) -> int | None:
        for e in self.evals:
            if e.get("test_accuracy", 0.0) >= target:
                return int(e["samples"])
        return None


def parse_strategies(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise ConfigError("--strategies: give at least one strategy, e.g. single,sync,asp")
    for name in names:
        if name not in STRATEGIES:
            raise ConfigError(f"--strategies: {name!r} is not one of {', '.join(STRATEGIES)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"--strategies: {text!r} names a strategy twice")
    return names


def strategy_config(base: RunConfig, strategy: str, out: Path,
                    overrides: dict[str, Any] | None = None) -> RunConfig:
    """The base configuration with one strategy swapped in (single runs one worker)."""
    cfg = dataclasses.replace(base, strategy=strategy, out=str(out), progress=False)
    if cfg.threads == 0:
        cfg.threads = 1  # every process of every strategy gets one core's worth: a fair race
    if strategy in SINGLE_PROCESS:
        cfg.workers = 1
        cfg.slow_workers = {}
    if strategy == "sandblaster":
        # L-BFGS: --lr scales its step (natural value 1); Downpour's fetch/push knobs do not
        # apply; every iteration is a full-batch pass, counted in samples processed
        cfg.lr, cfg.nfetch, cfg.npush = 1.0, 1, 1
    for key, value in (overrides or {}).items():
        setattr(cfg, key, value)
    if cfg.softsync > cfg.workers:
        cfg.softsync = cfg.workers
    return plan_evals(cfg).validate()


def plan_evals(cfg: RunConfig, points: int = 8) -> RunConfig:
    """Unless the user chose, evaluate about ``points`` times per run, so accuracy curves
    have a shape (``eval_every`` counts per-worker steps)."""
    if cfg.eval_every == 0 and cfg.max_steps == 0:
        per_worker_steps = cfg.epochs * base_train_size(cfg) / (cfg.workers * cfg.batch_size)
        if cfg.strategy == "sandblaster":  # an L-BFGS evaluation is one pass over the data
            per_worker_steps = cfg.epochs
        cfg.eval_every = max(1, int(per_worker_steps / points))
    return cfg


def base_train_size(cfg: RunConfig) -> int:
    """Training-set size without loading it (known sets), for planning evaluations."""
    known = {"fashion-mnist": 60000, "mnist": 60000, "synthetic": 4000, "digits": 1437,
             "cifar10": 50000}
    size = known.get(cfg.data, 60000)
    return min(size, cfg.train_limit) if cfg.train_limit else size


def read_run(label: str, out: Path) -> StrategyRun:
    summary = json.loads((out / "summary.json").read_text())
    evals = []
    with open(out / "events.jsonl") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("kind") == "eval" and "test_accuracy" in record:
                evals.append(record)
    evals.sort(key=lambda e: e.get("wall_s", 0.0))
    return StrategyRun(label, summary, evals)


def run_variants(variants: Sequence[tuple[str, RunConfig]], *,
                 say: Callable[[str], None] | None = None) -> list[StrategyRun]:
    """Train each (label, config) in turn, one progress line per run."""
    from phalanx.api import train

    say = say or (lambda s: print(s, file=sys.stderr, flush=True))
    runs = []
    for i, (label, cfg) in enumerate(variants, 1):
        say(f"[{i}/{len(variants)}] {label}: {cfg.strategy} x{cfg.workers} workers ...")
        t0 = time.perf_counter()
        cfg.overwrite = True  # the study owns its sub-folders: a rerun replaces them
        result = train(config=cfg)
        s = result.summary
        say(f"[{i}/{len(variants)}] {label}: test accuracy {s['test_accuracy']:.4f} "
            f"in {time.perf_counter() - t0:.1f}s")
        runs.append(read_run(label, Path(cfg.out)))
    return runs


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def table(runs: Sequence[StrategyRun], target: float) -> str:
    head = (f"| run | strategy | workers | test acc | time to {target:.2f} (s) | "
            f"samples to {target:.2f} | "
            "samples/s | staleness mean | staleness max | bytes/sample |")
    lines = [head, "|" + "---|" * 10]
    for r in runs:
        s = r.summary
        lines.append("| " + " | ".join([
            r.label, s.get("strategy", "?"), str(s.get("workers", 1)),
            _fmt(s.get("test_accuracy"), ".4f"), _fmt(r.time_to(target), ".1f"),
            _fmt(r.samples_to(target)), _fmt(s.get("samples_per_s"), ".0f"),
            _fmt(s.get("staleness_mean"), ".2f"), _fmt(s.get("staleness_max")),
            _fmt(s.get("bytes_per_sample"), ".0f"),
        ]) + " |")
    return "\n".join(lines)


def write_plots(runs: Sequence[StrategyRun], out: Path) -> list[Path]:
    acc_time = {r.label: ([e["wall_s"] for e in r.evals], [e["test_accuracy"] for e in r.evals])
                for r in runs}
    acc_samples = {r.label: ([e["samples"] for e in r.evals],
                             [e["test_accuracy"] for e in r.evals]) for r in runs}
    hists = {r.label: r.summary.get("staleness_histogram") or [] for r in runs}
    return [
        plots.line_plot(out / "accuracy_vs_time.png", acc_time, xlabel="wall time (s)",
                        ylabel="test accuracy", title="Test accuracy against wall time"),
        plots.line_plot(out / "accuracy_vs_samples.png", acc_samples,
                        xlabel="training samples seen (all workers)", ylabel="test accuracy",
                        title="Test accuracy against samples seen"),
        plots.histogram_plot(out / "staleness.png", hists, xlabel="staleness (server updates)",
                             title="Staleness of applied updates"),
        plots.bar_plot(out / "bytes_per_sample.png",
                       {r.label: float(r.summary.get("bytes_per_sample", 0.0)) for r in runs},
                       ylabel="bytes moved per training sample", title="Communication cost",
                       xlabel="run"),
    ]


def report_head(title: str, preamble: str = "", command: str = "") -> list[str]:
    """A report's first lines: the title, an optional preamble and the command to rerun."""
    parts = [f"# {title}", ""]
    if preamble:
        parts += [preamble, ""]
    if command:
        parts += ["Reproduce:", "", "```sh", command, "```", ""]
    return parts


def write_report(runs: Sequence[StrategyRun], out: Path, *, title: str, target: float,
                 preamble: str = "", command: str = "") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    pngs = write_plots(runs, out)
    parts = report_head(title, preamble, command)
    parts += [table(runs, target), ""]
    parts += [f"![{p.stem}]({p.name})" for p in pngs]
    parts += ["", "Each run's folder holds config.json, events.jsonl, summary.json and "
              "TensorBoard files (`tensorboard --logdir .`)."]
    path = out / "report.md"
    path.write_text("\n".join(parts) + "\n")
    (out / "results.json").write_text(json.dumps(
        [{"label": r.label, "summary": r.summary, "time_to_target": r.time_to(target),
          "samples_to_target": r.samples_to(target)} for r in runs], indent=2) + "\n")
    return path


def compare(base: RunConfig, strategies: Sequence[str], out: Path, *, target: float = 0.8,
            command: str = "", seeds: Sequence[int] | None = None) -> tuple[Any, Path]:
    """Every strategy once per seed (default: the base seed); returns the
    :class:`~phalanx.experiments.seeds.SeededRuns` and the report's path."""
    from phalanx.experiments.seeds import run_seeded, write_seeded_report

    out.mkdir(parents=True, exist_ok=True)
    seeds = list(seeds) if seeds else [base.seed]
    runs = run_seeded(lambda seed, folder: [
        (s, strategy_config(dataclasses.replace(base, seed=seed), s, folder / s))
        for s in strategies], out, seeds)
    desc = (f"Model `{base.model}` on `{base.data}`, {base.epochs:g} epoch(s), batch "
            f"{base.batch_size} per worker, rule `{base.rule}` (lr {base.lr}), "
            f"{base.workers} workers for the multi-worker strategies, one intra-op thread per "
            "process"
            + (f", slow workers {base.slow_workers}" if base.slow_workers else "") + ".")
    report = write_seeded_report(runs, out, title="Strategy comparison", target=target,
                                 preamble=desc, command=command)
    return runs, report
