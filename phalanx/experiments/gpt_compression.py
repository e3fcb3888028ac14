"""Compression of the GPT's gradients under sync data parallel, with error feedback:
PowerSGD (rank 4), top-k 1% and int8 against uncompressed, validation loss against bytes
per token, over seeds."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from phalanx.experiments.common import variant, verdict_block
from phalanx.experiments.gpt_common import (
    SETUP,
    delta_cell,
    gpt_config,
    load_now,
    loss_cell,
    loss_vs,
    seeds_flag,
    study_load,
)
from phalanx.experiments.seeds import SeededRuns, run_seeded, write_seeded_report
from phalanx.experiments.stats import FAILS, HOLDS, INCONCLUSIVE
from phalanx.metrics import plots

COMPRESSORS = ("none", "powersgd:4", "topk:0.01", "int8")
TOLERANCE = 0.05  # nats per token (about 5% in perplexity): "as good as uncompressed"
SAVING = 3.0  # and at least this many times fewer bytes per token


def within(sr: SeededRuns, label: str) -> tuple[str, str]:
    """Is ``label``'s loss within TOLERANCE of uncompressed? The paired difference's 95%
    interval decides: all below +TOLERANCE holds, all above fails, else inconclusive."""
    d, _ = loss_vs(sr, label, "none")
    if d.n < 2:
        return INCONCLUSIVE, f"Δ {d.mean:+.3f} from one seed: no interval"
    if d.high < TOLERANCE:
        return HOLDS, f"Δ {delta_cell(d)}: its interval below +{TOLERANCE}"
    if d.low > TOLERANCE:
        return FAILS, f"Δ {delta_cell(d)}: its interval above +{TOLERANCE}"
    return INCONCLUSIVE, f"Δ {delta_cell(d)}: its interval straddles +{TOLERANCE}"


def run(out: Path, *, quick: bool, data: str | None, seeds: Sequence[int],
        reuse: bool = False) -> Path:
    before = load_now()
    comps = COMPRESSORS[:2] if quick else COMPRESSORS

    def make(seed: int, folder: Path):
        base = gpt_config(folder, quick=quick, seed=seed, strategy="sync", workers=2)
        return [variant(base, folder, c, compress=c,
                        **({"error_feedback": True} if c != "none" else {}))
                for c in comps]

    sr = run_seeded(make, out, seeds, reuse=reuse)
    ref_bytes = sr.stat("none", "bytes_per_token").mean
    rows = ["| compressor | val loss (mean ± 95% CI) | Δ vs none (paired, 95% CI) | bytes/token "
            f"| saving | within {TOLERANCE} nats and >= {SAVING:g}x fewer bytes? | tokens/s |",
            "|---|---|---|---|---|---|---|"]
    words, lines = [], []
    for c in comps:
        b = sr.stat(c, "bytes_per_token").mean
        saving = ref_bytes / b if b else float("inf")
        if c == "none":
            delta, word = "—", "(reference)"
        else:
            w, basis = within(sr, c)
            if saving < SAVING:
                w = FAILS if w != INCONCLUSIVE else INCONCLUSIVE
                basis += f"; only {saving:.1f}x fewer bytes"
            words.append(w)
            delta, word = delta_cell(loss_vs(sr, c, "none")[0]), f"{w} ({basis})"
            lines.append(f"{c}: {w} ({basis}, {saving:.1f}x fewer bytes per token)")
        rows.append(f"| {c} | {loss_cell(sr.stat(c, 'test_loss'))} | {delta} | {b:,.1f} | "
                    f"{saving:.1f}x | {word} | {sr.stat(c, 'tokens_per_s').mean:,.0f} |")
    out.mkdir(parents=True, exist_ok=True)
    plots.scatter_plot(out / "loss_vs_bytes.png",
                       {c: ([sr.stat(c, "bytes_per_token").mean],
                            [sr.stat(c, "test_loss").mean]) for c in comps},
                       xlabel="bytes per training token (log)",
                       ylabel="validation loss (nats/token, mean over seeds)",
                       title="GPT gradients compressed under sync (error feedback)")
    overall = (HOLDS if words and all(w == HOLDS for w in words) else
               FAILS if FAILS in words else INCONCLUSIVE)
    pre = verdict_block(f"with error feedback, each compressor (PowerSGD rank 4, top-k 1%, "
                        f"int8) keeps the GPT's validation loss within {TOLERANCE} nats/token "
                        f"of uncompressed sync while moving >= {SAVING:g}x fewer bytes per "
                        "token", "; ".join(lines) + ".", overall)
    pre += ("\n\nSet-up: " + SETUP + " Sync data parallel, 2 workers, the GPT's recipe "
            "(AdamW 1e-3, warm-up + cosine, wd 0.1) on the workers; every compressor with "
            "error feedback (each worker re-sends what compression dropped).")
    pre += "\n\n" + study_load(out, before, reuse=reuse)
    pre += "\n\n" + "\n".join(rows) + "\n\n![loss vs bytes](loss_vs_bytes.png)"
    return write_seeded_report(sr, out, title="Compressed GPT gradients: validation loss "
                               "against bytes per token", target=0.0, preamble=pre,
                               command="phalanx experiments run gpt-compression"
                               + (" --quick" if quick else "") + seeds_flag(seeds))
