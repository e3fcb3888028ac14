"""Every strategy on the GPT (issue 32): validation loss with its 95% interval over seeds,
steady-state tokens/s and bytes per token, each beside single, at one fixed token budget.
Runs through ``phalanx compare`` (the report is compare's, with this study's verdict and
the beside-single table on top)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from phalanx.experiments.common import verdict_block
from phalanx.experiments.compare import compare
from phalanx.experiments.defaults import strategies as cost_order
from phalanx.experiments.gpt_common import (
    GPT_FLAGS,
    SETUP,
    gpt_config,
    load_now,
    seeds_flag,
    study_load,
)
from phalanx.experiments.lm_figures import perplexity
from phalanx.experiments.seeds import SeededRuns
from phalanx.experiments.stats import FAILS, HOLDS, INCONCLUSIVE, compare_lower, summarize

QUICK = ("single", "sync", "asp")
# what one strategy changes: hybrid runs 2 replicas of the 2-stage pipeline (4 processes,
# the same global batch as 2 data-parallel workers); L-BFGS is full batch, so it gets a
# quarter of the windows (first 1,568: ~100k tokens) for 4 passes: ~400k tokens processed
OVERRIDES = {"hybrid": {"replicas": 2}, "sandblaster": {"train_limit": 1568, "epochs": 4.0}}
UNIFORM = math.log(65)  # the loss of a uniform guess over the 65 characters


def order(quick: bool) -> list[str]:
    """Every registered strategy (single first: the reference), cheapest first."""
    names = list(QUICK) if quick else cost_order()
    return ["single"] + [n for n in names if n != "single"]


def beside_single(sr: SeededRuns) -> str:
    """Each strategy's loss, tokens/s and bytes per token, with its difference to single
    (loss: paired over the same seeds) and its throughput as a multiple of single's."""
    ref_loss, ref_rate = sr.values("single", "test_loss"), sr.stat("single", "tokens_per_s").mean
    lines = ["| strategy | val loss (mean ± 95% CI) | perplexity | Δ loss vs single | "
             "lower than single? | tokens/s | × single | bytes/token |",
             "|---|---|---|---|---|---|---|---|"]
    for label in sr.labels:
        loss = sr.stat(label, "test_loss")
        ci = (f"{loss.mean:.3f} ± {loss.high - loss.mean:.3f}" if loss.n > 1
              else f"{loss.mean:.3f}")
        rate = sr.stat(label, "tokens_per_s").mean
        if label == "single":
            delta, word = "—", "(reference)"
        else:
            d = summarize([a - b for a, b in zip(sr.values(label, "test_loss"), ref_loss)])
            delta = f"{d.mean:+.3f}" + (f" [{d.low:+.3f}, {d.high:+.3f}]" if d.n > 1 else "")
            v = compare_lower(sr.values(label, "test_loss"), ref_loss)
            word = {HOLDS: "yes (significant)", FAILS: "no: higher (significant)",
                    INCONCLUSIVE: "no significant difference"}[v.word]
        lines.append(f"| {label} | {ci} | {perplexity(loss.mean):.2f} | {delta} | {word} | "
                     f"{rate:,.0f} | {rate / ref_rate:.2f} | "
                     f"{sr.stat(label, 'bytes_per_token').mean:,.0f} |")
    return "\n".join(lines)


def same_updates(sr: SeededRuns) -> list[list[str]]:
    """Strategies whose validation loss is identical on every seed (to 1e-5): they applied
    the same updates (one batch cut across processes; or the same global batch)."""
    groups: list[list[str]] = []
    for label in sr.labels:
        mine = sr.values(label, "test_loss")
        for g in groups:
            if all(abs(a - b) < 1e-5 for a, b in zip(mine, sr.values(g[0], "test_loss"))):
                g.append(label)
                break
        else:
            groups.append([label])
    return [g for g in groups if len(g) > 1]


def reading(sr: SeededRuns) -> str:
    groups = same_updates(sr)
    if not groups:
        return ""
    return ("Identical validation loss on every seed (the same updates, computed by "
            "different processes): " + "; ".join("{" + ", ".join(g) + "}" for g in groups)
            + ". At a fixed token budget a strategy that averages 2 workers' gradients "
            "(sync, bsp, hybrid with 2 replicas) takes half of single's optimizer steps on "
            "twice the batch at the same learning rate and warm-up, so its loss is higher "
            "after the same tokens; the asynchronous ones apply every worker's batch as its "
            "own (stale) update, as many updates as single.")


def learns(sr: SeededRuns) -> tuple[bool | None, str]:
    """Claim: every strategy's validation loss lies below a uniform guess (ln 65) with its
    whole 95% interval."""
    below, above = [], []
    for label in sr.labels:
        s = sr.stat(label, "test_loss")
        high = s.high if s.n > 1 else math.nan
        (below if high < UNIFORM else above).append(f"{label} ({s.fmt_ci('.3f')})")
    if len(sr.seeds) < 2:
        return None, "one seed: no interval"
    return not above, ("every strategy's 95% interval lies below "
                       f"ln 65 = {UNIFORM:.3f}" if not above else
                       "not below ln 65 with its whole interval: " + ", ".join(above))


def run(out: Path, *, quick: bool, data: str | None, seeds: Sequence[int],
        reuse: bool = False) -> Path:
    before = load_now()
    base = gpt_config(out, quick=quick, seed=seeds[0], workers=2, stages=2)
    names = order(quick)
    cmd = ("phalanx compare " + GPT_FLAGS + " --workers 2 --strategies " + ",".join(names)
           + seeds_flag(seeds))
    study = ("phalanx experiments run gpt-strategies" + (" --quick" if quick else "")
             + seeds_flag(seeds))
    sr, report = compare(base, names, out, command=study, seeds=seeds, reuse=reuse,
                         overrides=OVERRIDES)
    holds, measured = learns(sr)
    pre = verdict_block("every strategy trains the GPT: at the same token budget its "
                        f"validation loss lies below a uniform guess (ln 65 = {UNIFORM:.2f}) "
                        "with its whole 95% interval", measured, holds)
    pre += ("\n\nSet-up: " + SETUP + " Each strategy at the GPT's own recipe (AdamW 1e-3, "
            "100 warm-up steps then cosine, weight decay 0.1; on the servers for the "
            "parameter-server strategies); sandblaster is L-BFGS (its step 1) on the first "
            "1,568 windows for 4 full-batch passes (the same ~400k tokens processed). "
            "2 workers where a strategy takes workers; pipeline and model-parallel 2 stages "
            "(pipeline: 4 micro-batches, GPipe); hybrid 2 stages x 2 replicas; tensor 2 "
            "ranks. The same command through compare (without sandblaster's and hybrid's "
            f"own sizes): `{cmd}`.")
    load = study_load(out, before, reuse=reuse)
    pre += "\n\n" + load
    if reading(sr):
        pre += "\n\n" + reading(sr)
    pre += "\n\nEach strategy beside single (Δ: paired over the same seeds, 95% interval):"
    pre += "\n\n" + beside_single(sr)
    (out / "table.md").write_text(  # the table alone, for docs/workloads-gpt-table.md
        "\n\n".join([f"Seeds: {', '.join(map(str, sr.seeds))}. " + SETUP, beside_single(sr),
                      reading(sr), load, f"Reproduce: `{study}`"]) + "\n")
    text = report.read_text().splitlines()
    report.write_text("\n".join(["# Every strategy on the GPT", "", pre, *text[1:]]) + "\n")
    return report
