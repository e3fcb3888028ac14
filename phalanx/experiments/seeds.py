"""Repeated seeds: run every variant of a study once per seed, then tables of mean ± sd with
95% intervals, plots of the mean curve with a band, and the raw per-seed numbers.

An experiment (or ``phalanx compare``) calls :func:`run_seeded` with a function that builds
its (label, config) variants for one seed, and :func:`write_seeded_report` with its verdict
text; :class:`SeededRuns` gives the per-seed values that :mod:`phalanx.experiments.stats`
turns into a verdict.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.config import RunConfig
from phalanx.errors import ConfigError
from phalanx.experiments.lm_figures import LM_PAIRED, is_lm, lm_table, value_of
from phalanx.experiments.runs import StrategyRun, read_run, report_head, run_variants
from phalanx.experiments.stats import RULE, Summary, compare_higher, compare_lower, summarize
from phalanx.limits import MAX_SEED, short
from phalanx.metrics import plots
from phalanx.parallel.registry import check_config

VariantsFn = Callable[[int, Path], Sequence[tuple[str, RunConfig]]]


# seeds a study repeats each variant over: every one is a full training run
MAX_SEEDS = 100


def parse_seeds(text: str | None, base: int = 0) -> list[int]:
    """``"5"`` -> five seeds base..base+4; ``"0,3,7"`` -> those seeds; None -> [base]."""
    if text is None:
        return [base]
    try:
        if "," in text:
            seeds = [int(s) for s in text.split(",") if s.strip()]
        else:
            count = int(text)
            if count < 1:
                raise ValueError
            if count > MAX_SEEDS:
                raise ConfigError(f"--seeds: {count} runs per variant is more than {MAX_SEEDS} "
                                  "(an interval needs 3 to 10)")
            seeds = list(range(base, base + count))
    except ValueError:
        raise ConfigError(f"--seeds: {text!r} is neither a count >= 1 nor a comma list of "
                          "seeds, e.g. 5 or 0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0 or max(seeds) > MAX_SEED:
        raise ConfigError(f"--seeds: {short(text)} must name distinct seeds in 0..{MAX_SEED}")
    if len(seeds) > MAX_SEEDS:
        raise ConfigError(f"--seeds: {len(seeds)} seeds is more than {MAX_SEEDS}")
    return seeds


@dataclass
class SeededRuns:
    """Every variant's runs, one per seed, in the order of ``seeds``."""

    seeds: list[int]
    runs: dict[str, list[StrategyRun]]

    @property
    def labels(self) -> list[str]:
        return list(self.runs)

    @property
    def lm(self) -> bool:
        """Language-model runs (text data): loss, perplexity and tokens, not accuracy."""
        return bool(self.runs) and is_lm(self.first(self.labels[0]).summary)

    @property
    def key(self) -> str:
        """The quality the study is judged on: validation loss for a language model."""
        return "test_loss" if self.lm else "test_accuracy"

    def values(self, label: str, key: str = "test_accuracy") -> list[float]:
        return [value_of(r.summary, key) for r in self.runs[label]]

    def stat(self, label: str, key: str = "test_accuracy") -> Summary:
        return summarize(self.values(label, key))

    def first(self, label: str) -> StrategyRun:
        return self.runs[label][0]


def finished(cfg: RunConfig) -> bool:
    """A run folder that already holds a finished run of exactly this configuration."""
    folder = Path(cfg.out)
    # how the folder was prepared (--overwrite) is not part of the run's configuration
    ignore = {"overwrite"}
    try:
        saved = json.loads((folder / "config.json").read_text())
        # as the run saw it: checked, so the rule and lr a recipe or a strategy chose are
        # filled in (a study that leaves --rule / --lr out is found finished too)
        wanted = json.loads(json.dumps(check_config(dataclasses.replace(cfg)).to_json()))
        same = isinstance(saved, dict) and all(
            saved.get(k) == v for k, v in wanted.items() if k not in ignore) and not (
            set(saved) - set(wanted))
        return same and (folder / "summary.json").is_file()
    except (OSError, ValueError, ConfigError):
        return False


def run_seeded(make: VariantsFn, out: Path, seeds: Sequence[int], *,
               reuse: bool = False) -> SeededRuns:
    """``make(seed, folder)`` builds the variants of one seed. With one seed the runs go
    straight into ``out`` (the single-seed layout); with several, into ``out/seed<S>``.
    Seeds run one after another, each through all variants, so a machine whose load changes
    during the study disturbs every variant of a seed alike (which the paired test uses).
    ``reuse``: a run whose folder already holds a finished run of the same configuration is
    read back, not run again (to add seeds to a study, or finish an interrupted one)."""
    runs: dict[str, list[StrategyRun]] = {}
    for seed in seeds:
        folder = out if len(seeds) == 1 else out / f"seed{seed}"
        variants = list(make(seed, folder))
        if len(seeds) > 1:
            print(f"seed {seed} ({list(seeds).index(seed) + 1}/{len(seeds)})", file=sys.stderr,
                  flush=True)
        done = {label for label, cfg in variants if reuse and finished(cfg)}
        fresh = iter(run_variants([v for v in variants if v[0] not in done]))
        for label, cfg in variants:
            run = read_run(label, Path(cfg.out)) if label in done else next(fresh)
            runs.setdefault(run.label, []).append(run)
    return SeededRuns(list(seeds), runs)


def _mean_of(values: Sequence[float | None]) -> tuple[float | None, int]:
    got = [v for v in values if v is not None]
    return (sum(got) / len(got) if got else None), len(got)


def _cell(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def seeded_table(sr: SeededRuns, target: float) -> str:
    if sr.lm:  # no accuracy target for a language model: loss, perplexity, tokens
        return lm_table(sr)
    n = len(sr.seeds)
    head = (f"| run | strategy | workers | seeds | test acc (mean ± sd) | 95% CI | "
            f"time to {target:.2f} (s) | samples to {target:.2f} | samples/s (steady) | "
            "start-up (s) | staleness mean | staleness max | bytes/sample |")
    lines = [head, "|" + "---|" * 13]
    # ranked by steady-state samples/s, fastest first (start-up excluded: docs/events.md)
    for label in sorted(sr.labels, key=lambda lb: -sr.stat(lb, "samples_per_s").mean):
        runs, s0 = sr.runs[label], sr.first(label).summary
        acc = sr.stat(label)
        t, hit = _mean_of([r.time_to(target) for r in runs])
        samples, _ = _mean_of([r.samples_to(target) for r in runs])
        reached = "" if hit in (0, n) else f" ({hit}/{n})"
        stale_max = max(int(r.summary.get("staleness_max") or 0) for r in runs)
        lines.append("| " + " | ".join([
            label, str(s0.get("strategy", "?")), str(s0.get("workers", 1)), str(len(runs)),
            acc.fmt(), acc.fmt_ci(), _cell(t, ".1f") + reached, _cell(samples, ".0f"),
            _cell(sr.stat(label, "samples_per_s").mean, ".0f"),
            _cell(sr.stat(label, "startup_s").mean, ".1f"),
            "—" if s0.get("staleness_mean") is None
            else format(sr.stat(label, "staleness_mean").mean, ".2f"),
            "—" if s0.get("staleness_max") is None else str(stale_max),
            _cell(sr.stat(label, "bytes_per_sample").mean, ".0f"),
        ]) + " |")
    return "\n".join(lines)


# what a comparison of strategies decides, pair by pair: (summary key, what it is, format)
PAIRED_QUANTITIES = (("test_accuracy", "test accuracy", ".4f", True),
                     ("samples_per_s", "steady-state samples/s", ".0f", True))


def pairwise_verdicts(sr: SeededRuns) -> str:
    """For every pair of variants and each of :data:`PAIRED_QUANTITIES`: does the one with
    the higher mean really exceed the other, over the same seeds (intervals, then a paired
    t-test: :func:`~phalanx.experiments.stats.compare_higher`)?"""
    if len(sr.labels) < 2:
        return ""
    if len(sr.seeds) < 2:
        return ("Pairwise verdicts: none — one seed cannot give one (run with --seeds 3 or "
                "more).")
    lines = ["| claim | verdict | basis |", "|---|---|---|"]
    for key, what, fmt, higher in (LM_PAIRED if sr.lm else PAIRED_QUANTITIES):
        sign = 1.0 if higher else -1.0  # lower-better (loss): "better" is the lower mean
        for i, a in enumerate(sr.labels):
            for b in sr.labels[i + 1:]:
                hi, lo = ((a, b) if sign * sr.stat(a, key).mean >= sign * sr.stat(b, key).mean
                          else (b, a))
                v = (compare_higher if higher else compare_lower)(sr.values(hi, key),
                                                                  sr.values(lo, key))
                word = ">" if higher else "<"
                claim = (f"{hi} {word} {lo} in {what} ({format(sr.stat(hi, key).mean, fmt)} "
                         f"vs {format(sr.stat(lo, key).mean, fmt)})")
                lines.append(f"| {claim} | **{v.word}** | {v.basis} |")
    return "\n".join(lines)


def per_seed_table(sr: SeededRuns, key: str = "test_accuracy") -> str:
    lines = ["| run | " + " | ".join(f"seed {s}" for s in sr.seeds) + " |",
             "|" + "---|" * (len(sr.seeds) + 1)]
    for label in sr.labels:
        lines.append(f"| {label} | " + " | ".join(f"{v:.4f}" for v in sr.values(label, key))
                     + " |")
    return "\n".join(lines)


def _curves(runs: Sequence[StrategyRun], xkey: str, ykey: str = "test_accuracy",
            xscale: float = 1.0) -> tuple[list[float], list[Summary]]:
    """Eval curves aligned by evaluation index (every seed evaluates at the same step
    counts), cut to the shortest; x is the mean over seeds (times ``xscale``: tokens per
    sample for a language model)."""
    length = min(len(r.evals) for r in runs)
    xs = [xscale * sum(float(r.evals[i][xkey]) for r in runs) / len(runs)
          for i in range(length)]
    ys = [summarize([float(r.evals[i].get(ykey) or 0.0) for r in runs]) for i in range(length)]
    return xs, ys


def write_seeded_plots(sr: SeededRuns, out: Path) -> list[Path]:
    if sr.lm:
        return write_lm_plots(sr, out)
    paths = []
    for xkey, name, xlabel in (("wall_s", "accuracy_vs_time", "wall time (s)"),
                               ("samples", "accuracy_vs_samples",
                                "training samples seen (all workers)")):
        series = {}
        for label in sr.labels:
            xs, ys = _curves(sr.runs[label], xkey)
            # accuracy lives in [0, 1]: the t interval of few seeds can reach past it
            series[label] = (xs, [y.mean for y in ys],
                             [max(0.0, y.low) if y.n > 1 else y.mean for y in ys],
                             [min(1.0, y.high) if y.n > 1 else y.mean for y in ys])
        band = f" (mean of {len(sr.seeds)} seeds, band: 95% CI)" if len(sr.seeds) > 1 else ""
        paths.append(plots.band_plot(out / f"{name}.png", series, xlabel=xlabel,
                                     ylabel="test accuracy",
                                     title="Test accuracy" + band))
    return paths + _staleness_and_bytes(sr, out, "sample")


def _staleness_and_bytes(sr: SeededRuns, out: Path, unit: str) -> list[Path]:
    """The staleness histogram (one seed) and bytes moved per training ``unit`` (sample or
    token), mean over the seeds: what every seeded report plots beside its curves."""
    return [
        plots.histogram_plot(
            out / "staleness.png",
            {label: sr.first(label).summary.get("staleness_histogram") or []
             for label in sr.labels},
            xlabel="staleness (server updates)",
            title="Staleness of applied updates" + (f" (seed {sr.seeds[0]})"
                                                    if len(sr.seeds) > 1 else "")),
        plots.bar_plot(out / f"bytes_per_{unit}.png",
                       {label: sr.stat(label, f"bytes_per_{unit}").mean for label in sr.labels},
                       ylabel=f"bytes moved per training {unit}", title="Communication cost",
                       xlabel="run"),
    ]


def write_lm_plots(sr: SeededRuns, out: Path) -> list[Path]:
    """Validation loss against wall time and against training tokens (mean over seeds, 95%
    band), staleness, and bytes per token."""
    band = f" (mean of {len(sr.seeds)} seeds, band: 95% CI)" if len(sr.seeds) > 1 else ""
    context = float(sr.first(sr.labels[0]).summary.get("data_context") or 1)
    paths = []
    for xkey, name, xlabel, scale in (("wall_s", "loss_vs_time", "wall time (s)", 1.0),
                                      ("samples", "loss_vs_tokens",
                                       "training tokens seen (all workers)", context)):
        series = {}
        for label in sr.labels:
            xs, ys = _curves(sr.runs[label], xkey, "test_loss", scale)
            series[label] = (xs, [y.mean for y in ys],
                             [max(0.0, y.low) if y.n > 1 else y.mean for y in ys],
                             [y.high if y.n > 1 else y.mean for y in ys])
        paths.append(plots.band_plot(out / f"{name}.png", series, xlabel=xlabel,
                                     ylabel="validation loss (nats/token)",
                                     title="Validation loss" + band))
    return paths + _staleness_and_bytes(sr, out, "token")


def write_seeded_report(sr: SeededRuns, out: Path, *, title: str, target: float,
                        preamble: str = "", command: str = "") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    pngs = write_seeded_plots(sr, out)
    parts = report_head(title, preamble, command)
    seeds = ", ".join(map(str, sr.seeds))
    parts += [f"Seeds: {seeds} ({len(sr.seeds)}). {RULE}", "", seeded_table(sr, target), ""]
    verdicts = pairwise_verdicts(sr)
    if verdicts:
        parts += ["Pairwise verdicts over the same seeds:", "", verdicts, ""]
    if len(sr.seeds) > 1:
        parts += [("Validation loss" if sr.lm else "Test accuracy") + " per seed:", "",
                  per_seed_table(sr, sr.key), ""]
    parts += [f"![{p.stem}]({p.name})" for p in pngs]
    parts += ["", "Each run's folder holds config.json, events.jsonl, summary.json and "
              "TensorBoard files (`tensorboard --logdir .`)."]
    path = out / "report.md"
    path.write_text("\n".join(parts) + "\n")
    (out / "results.json").write_text(json.dumps(results_json(sr, target), indent=2) + "\n")
    return path


def results_json(sr: SeededRuns, target: float) -> list[dict[str, Any]]:
    rows = []
    for label in sr.labels:
        acc = sr.stat(label)
        row = {"label": label, "seeds": sr.seeds, "summary": sr.first(label).summary,
               "test_accuracy": _stat_json(acc)}
        if sr.lm:
            row["test_loss"] = _stat_json(sr.stat(label, "test_loss"))
            row["tokens_per_s"] = _stat_json(sr.stat(label, "tokens_per_s"))
            row["bytes_per_token"] = _stat_json(sr.stat(label, "bytes_per_token"))
        rows.append({
            **row,
            "runs": [{"seed": seed, "summary": r.summary, "time_to_target": r.time_to(target),
                      "samples_to_target": r.samples_to(target)}
                     for seed, r in zip(sr.seeds, sr.runs[label])],
        })
    return rows


def _stat_json(s: Summary) -> dict[str, Any]:
    return {"n": s.n, "mean": s.mean, "sd": _num(s.sd), "ci95": [_num(s.low), _num(s.high)]}


def _num(x: float) -> float | None:
    return None if x != x else x  # NaN (one seed) -> null
