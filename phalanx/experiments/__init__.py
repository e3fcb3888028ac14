"""Studies built on the strategies: each writes a report folder (Markdown + PNG) whose
verdict is stated in numbers next to the claim it tests."""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Sequence
from pathlib import Path

from phalanx.errors import ConfigError

# name -> (claim, module with run(out: Path, *, quick: bool, data: str | None, seeds: list[int])
# -> Path); a module whose run() takes ``seed: int`` instead is exact (one seed is enough)
EXPERIMENTS: dict[str, tuple[str, str]] = {
    "sync-large-batch": ("sync data parallel equals serial SGD with an N-times larger batch",
                         "phalanx.experiments.sync_large_batch"),
    "averaging-period": ("averaging period sweep: accuracy against bytes moved",
                         "phalanx.experiments.averaging_period"),
    "staleness-vs-workers": ("mean ASGD staleness is about the number of workers",
                             "phalanx.experiments.staleness_workers"),
    "dc-asgd": ("DC-ASGD beats ASGD and SSGD and approaches sequential SGD",
                "phalanx.experiments.dc_asgd"),
    "ring-traffic": ("ring allreduce sends 2X(N-1)/N per worker, a main node 2X(N-1)",
                     "phalanx.experiments.ring_traffic"),
    "ssp-softsync": ("SSP bound and soft-sync n: time to accuracy",
                     "phalanx.experiments.ssp_softsync"),
    "bandwidth": ("on shaped links (1 Gbit/s - 20 Mbit/s): ring traffic flat in N, main node's "
                  "grows; async and averaging gain most on slow links",
                  "phalanx.experiments.bandwidth"),
    "compression": ("compressor x protocol: accuracy against bytes, and its frontier",
                    "phalanx.experiments.compression"),
    "defaults": ("at its defaults every strategy reaches 0.70 on 4,000 Fashion-MNIST images "
                 "in 3 epochs, on every seed", "phalanx.experiments.defaults"),
    "error-feedback": ("top-k 1% with error feedback is within 1 point of uncompressed",
                       "phalanx.experiments.error_feedback"),
    "ctr-strategies": ("click model: sparse rows move >= 50x fewer bytes than the dense "
                       "table's allreduce, at the same log-loss",
                       "phalanx.experiments.ctr_strategies"),
    "gpt-strategies": ("every strategy trains the GPT: validation loss (95% CI), tokens/s "
                       "and bytes per token beside single", "phalanx.experiments.gpt_strategies"),
    "gpt-staleness": ("GPT, AdamW on the server: ASGD's mean staleness is about N - 1, and "
                      "its loss cost", "phalanx.experiments.gpt_staleness"),
    "gpt-dc-asgd": ("GPT, AdamW on the server: DC-ASGD reaches a lower validation loss than "
                    "ASGD", "phalanx.experiments.gpt_dc_asgd"),
    "gpt-compression": ("GPT under sync: PowerSGD, top-k and int8 with error feedback keep "
                        "the loss within 0.05 nats at fewer bytes per token",
                        "phalanx.experiments.gpt_compression"),
    "gpt-pipeline-bubble": ("GPT pipeline (GPipe, 1F1B): the measured bubble follows "
                            "(P-1)/(M+P-1)", "phalanx.experiments.gpt_pipeline_bubble"),
    "gpt-memory": ("GPT: ZeRO's ranks hold the formula's bytes at N = 1, 2, 4 and ZeRO-3 "
                   "trains to sync's loss at the same tokens", "phalanx.experiments.gpt_memory"),
}


ONE_SEED = ("**One seed cannot give a verdict.** This study's quantities are noisy: with one "
            "seed there is no interval, so every claim below is inconclusive by construction. "
            "Run it with `--seeds 3` (or more) for a verdict.")


def _say_one_seed(report: Path) -> None:
    """Say it plainly, at the top of the report and on the terminal."""
    lines = report.read_text().splitlines()
    at = 1 if lines and lines[0].startswith("#") else 0
    report.write_text("\n".join([*lines[:at], "", ONE_SEED, *lines[at:]]) + "\n")
    print(ONE_SEED.replace("**", "").replace("`", ""), file=sys.stderr, flush=True)


def run_experiment(name: str, out: Path, *, quick: bool = False, data: str | None = None,
                   seed: int = 0, seeds: Sequence[int] | None = None,
                   reuse: bool = False) -> Path:
    if name not in EXPERIMENTS:
        raise ConfigError(f"experiments run: {name!r} is not one of {', '.join(EXPERIMENTS)}")
    module = importlib.import_module(EXPERIMENTS[name][1])
    seeds = list(seeds) if seeds else [seed]
    params = inspect.signature(module.run).parameters
    if "seeds" in params:
        extra = {"reuse": reuse} if "reuse" in params else {}
        report = module.run(Path(out), quick=quick, data=data, seeds=seeds, **extra)
        if len(seeds) == 1:
            _say_one_seed(Path(report))
        return report
    if len(seeds) > 1:  # exact experiments (byte counts, equivalences) take one seed
        print(f"{name}: runs one seed (exact); running seed {seeds[0]} only",
              file=sys.stderr, flush=True)
    return module.run(Path(out), quick=quick, data=data, seed=seeds[0])
