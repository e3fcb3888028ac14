"""The GPT studies' shared set-up (issue 32's evidence): one small character-level GPT on
Tiny Shakespeare, sized for 2 shared cores, and the machine's load around a study."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from phalanx.config import RunConfig
from phalanx.experiments.stats import Summary, Verdict, compare_lower, summarize

# the sizes every GPT study trains: 2 blocks of width 64 with 4 heads, 64-character windows,
# batch 16 per worker, a tenth of an epoch (~6,270 windows, ~400k training tokens per run,
# all workers together), validation on the first 256 held-out windows (16,384 tokens)
GPT = {"model": "gpt", "data": "shakespeare", "gpt_layers": 2, "gpt_dim": 64, "gpt_heads": 4,
       "context": 64, "batch_size": 16, "epochs": 0.1, "test_limit": 256}
GPT_FLAGS = ("--model gpt --data shakespeare --gpt-layers 2 --gpt-dim 64 --gpt-heads 4 "
             "--context 64 --batch-size 16 --epochs 0.1 --test-limit 256")
QUICK = {"epochs": 0.01, "test_limit": 32}  # CI-sized: ~600 windows, a few seconds a run
SETUP = ("GPT: 2 blocks, width 64, 4 heads, 64-character windows of Tiny Shakespeare "
         "(character tokens, vocabulary 65), batch 16 per worker, a tenth of an epoch "
         "(about 6,270 windows, 400k training tokens per run, all workers together), "
         "validation loss in nats per token on the first 256 held-out windows (16,384 "
         "tokens); one intra-op thread per process.")
SHARED = ("All runs on a shared 2-core machine (two other developers' jobs ran beside "
          "them): throughput and timing numbers are contended, ratios within one seed are "
          "more telling than absolute values.")


# the rule the GPT studies ran with (the GPT's recipe when they were run; pinned, so that
# a later change of the recipe, now AdamW 2e-3 with a constant rate, leaves them as reported)
STUDY_RULE = {"rule": "adamw", "lr": 1e-3, "schedule": "cosine", "warmup_steps": 100,
              "weight_decay": 0.1}


def gpt_config(out: Path, *, quick: bool, seed: int, **overrides: Any) -> RunConfig:
    """The GPT studies' base run: AdamW 1e-3, warm-up 100 then cosine, weight decay 0.1
    (``STUDY_RULE``) unless ``overrides`` say otherwise."""
    values: dict[str, Any] = {**GPT, **STUDY_RULE, **(QUICK if quick else {}), "seed": seed,
                              "out": str(out), "progress": False, "tensorboard": False,
                              "threads": 1}
    values.update(overrides)
    return RunConfig(**values)


def load_now() -> str:
    """The 1, 5 and 15 minute load averages, as ``uptime`` prints them."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def load_line(before: str, after: str) -> str:
    return (f"Machine load (1, 5, 15-minute averages, 2 cores): {before} before the runs, "
            f"{after} after. {SHARED}")


def study_load(out: Path, before: str, *, reuse: bool = False) -> str:
    """The load line of a study's report. The load while its runs trained is kept in
    ``out/load.json``: a study that reads every run back (``--reuse``) reports that one,
    not the load of writing the report."""
    path = out / "load.json"
    if reuse and path.is_file():
        saved = json.loads(path.read_text())
        return (load_line(saved["before"], saved["after"])
                + " (Recorded when the runs were trained.)")
    after = load_now()
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"before": before, "after": after}) + "\n")
    return load_line(before, after)


def seeds_flag(seeds: Sequence[int]) -> str:
    return f" --seeds {','.join(map(str, seeds))}" if len(seeds) > 1 else ""


def loss_vs(sr: Any, label: str, ref: str) -> tuple[Summary, Verdict]:
    """``label``'s validation loss minus ``ref``'s, paired over the same seeds (mean and
    95% interval), and whether ``label``'s is lower
    (:func:`~phalanx.experiments.stats.compare_lower`)."""
    a, b = sr.values(label, "test_loss"), sr.values(ref, "test_loss")
    return (summarize([x - y for x, y in zip(a, b)]),
            compare_lower(a, b))


def loss_cell(s: Summary) -> str:
    """Mean ± the 95% interval's half-width (the mean alone from one seed)."""
    return f"{s.mean:.3f} ± {s.high - s.mean:.3f}" if s.n > 1 else f"{s.mean:.3f}"


def delta_cell(d: Summary) -> str:
    return f"{d.mean:+.3f}" + (f" [{d.low:+.3f}, {d.high:+.3f}]" if d.n > 1 else "")
