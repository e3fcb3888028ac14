"""Runs of a study and their report: train (label, config) variants one after the other,
read each run back from its folder, and write the Markdown table and plots."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.config import RunConfig
from phalanx.entry.api import train
from phalanx.metrics import plots
from phalanx.parallel.registry import check_config


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
    say = say or (lambda s: print(s, file=sys.stderr, flush=True))
    for _, cfg in variants:
        check_config(cfg)  # every run's settings before the first starts: one line, no output
    runs = []
    for i, (label, cfg) in enumerate(variants, 1):
        say(f"[{i}/{len(variants)}] {label}: {cfg.strategy} x{cfg.workers} workers ...")
        t0 = time.perf_counter()
        cfg.overwrite = True  # the study owns its sub-folders: a rerun replaces them
        result = train(config=cfg)
        s = result.summary
        quality = (f"validation loss {s['test_loss']:.4f}" if s.get("test_perplexity")
                   is not None else f"test accuracy {s['test_accuracy']:.4f}")
        say(f"[{i}/{len(variants)}] {label}: {quality} in {time.perf_counter() - t0:.1f}s")
        runs.append(read_run(label, Path(cfg.out)))
    return runs


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def by_rate(runs: Sequence[StrategyRun]) -> list[StrategyRun]:
    """Fastest first by steady-state samples/s (start-up excluded: docs/events.md)."""
    return sorted(runs, key=lambda r: -(r.summary.get("samples_per_s") or 0.0))


def table(runs: Sequence[StrategyRun], target: float) -> str:
    """One row per run, ranked by steady-state samples/s; start-up beside it."""
    head = (f"| run | strategy | workers | test acc | time to {target:.2f} (s) | "
            f"samples to {target:.2f} | "
            "samples/s (steady) | start-up (s) | staleness mean | staleness max | "
            "bytes/sample |")
    lines = [head, "|" + "---|" * 11]
    for r in by_rate(runs):
        s = r.summary
        lines.append("| " + " | ".join([
            r.label, s.get("strategy", "?"), str(s.get("workers", 1)),
            _fmt(s.get("test_accuracy"), ".4f"), _fmt(r.time_to(target), ".1f"),
            _fmt(r.samples_to(target)), _fmt(s.get("samples_per_s"), ".0f"),
            _fmt(s.get("startup_s"), ".1f"),
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
