"""Staleness against workers with Adam on the servers (the GPT): ASGD with N = 1, 2, 4
workers, AdamW on the parameter server; mean staleness is about N - 1, and what it costs
in validation loss at the same token budget."""

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
from phalanx.experiments.seeds import run_seeded, write_seeded_report
from phalanx.experiments.staleness_workers import BAND, _slope, _slope_verdict
from phalanx.experiments.stats import Summary, combine, compare_higher, summarize
from phalanx.metrics import plots

SIZES = (1, 2, 4)


def run(out: Path, *, quick: bool, data: str | None, seeds: Sequence[int],
        reuse: bool = False) -> Path:
    before = load_now()
    sizes = SIZES[:2] + ((4,) if not quick else ())

    def make(seed: int, folder: Path):
        # no --rule: the GPT's recipe, AdamW on the server (warm-up + cosine, wd 0.1)
        base = gpt_config(folder, quick=quick, seed=seed, strategy="asp", servers=1)
        return [variant(base, folder, f"asp N={n}", workers=n) for n in sizes]

    sr = run_seeded(make, out, seeds, reuse=reuse)
    labels = [f"asp N={n}" for n in sizes]
    stale = [sr.stat(label, "staleness_mean") for label in labels]
    multi = [n for n in sizes if n > 1]
    slopes = [_slope(multi, [sr.values(f"asp N={n}", "staleness_mean")[i] for n in multi])
              for i in range(len(sr.seeds))]
    growth = [compare_higher(sr.values(b, "staleness_mean"), sr.values(a, "staleness_mean"))
              for a, b in zip(labels, labels[1:])]
    slope_word, slope_basis = _slope_verdict(slopes)
    out.mkdir(parents=True, exist_ok=True)
    plots.band_plot(out / "staleness_vs_workers.png",
                    {"measured mean staleness": (list(sizes), [m.mean for m in stale],
                                                 [m.low if m.n > 1 else m.mean for m in stale],
                                                 [m.high if m.n > 1 else m.mean for m in stale]),
                     "N - 1": (list(sizes), [n - 1 for n in sizes], [n - 1 for n in sizes],
                               [n - 1 for n in sizes])},
                    xlabel="workers N", ylabel="mean staleness (server updates)",
                    title="ASGD staleness against workers (GPT, AdamW on the server)")
    losses = [sr.stat(label, "test_loss") for label in labels]
    plots.band_plot(out / "loss_vs_workers.png",
                    {"validation loss": (list(sizes), [m.mean for m in losses],
                                         [m.low if m.n > 1 else m.mean for m in losses],
                                         [m.high if m.n > 1 else m.mean for m in losses])},
                    xlabel="workers N", ylabel="validation loss (nats/token)",
                    title="ASGD's loss at the same token budget")
    rows = ["| N | mean staleness (mean ± sd) | 95% CI | max | N - 1 | val loss (mean ± 95% CI) "
            "| Δ loss vs N=1 (paired, 95% CI) | loss higher than N=1? | tokens/s |",
            "|---|---|---|---|---|---|---|---|---|"]
    costs = []
    for n, label, m in zip(sizes, labels, stale):
        mx = max(int(v) for v in sr.values(label, "staleness_max"))
        if n == 1:
            delta, word = "—", "(reference)"
        else:
            d, v = loss_vs(sr, labels[0], label)  # is N=1's loss lower than N's?
            d = _negate(d)  # shown as N minus N=1: the cost of N workers
            costs.append((n, d, v))
            delta, word = delta_cell(d), v.word
        rows.append(f"| {n} | {m.fmt('.2f')} | {m.fmt_ci('.2f')} | {mx} | {n - 1} | "
                    f"{loss_cell(sr.stat(label, 'test_loss'))} | {delta} | {word} | "
                    f"{sr.stat(label, 'tokens_per_s').mean:,.0f} |")
    measured = ("mean staleness " + ", ".join(f"{m.fmt('.2f')} at N={n}"
                                              for n, m in zip(sizes, stale))
                + f"; fitted per seed: mean staleness = {summarize(slopes).fmt('.2f')} x "
                "(N - 1). Growth with N: "
                + "; ".join(f"N={b} over N={a}: {v.word} ({v.basis})"
                            for a, b, v in zip(sizes, sizes[1:], growth))
                + f". Slope: {slope_word} ({slope_basis}). Loss cost at the same tokens: "
                + "; ".join(f"N={n} minus N=1 {delta_cell(d)} nats/token "
                            f"(higher than N=1: {v.word}, {v.basis})" for n, d, v in costs)
                + ".")
    pre = verdict_block(f"with AdamW on the server, ASGD's mean staleness grows with N, about "
                        f"N - 1 (fitted slope in [{BAND[0]}, {BAND[1]}])", measured,
                        combine([*growth, slope_word]))
    pre += ("\n\nSet-up: " + SETUP + " ASGD (asp), 1 server shard applying AdamW 1e-3 with "
            "the GPT's warm-up + cosine and weight decay 0.1; the same ~400k tokens for every N "
            "(N workers share them: each pushes 1/N of the ~392 updates).")
    pre += "\n\n" + study_load(out, before, reuse=reuse)
    pre += "\n\n" + "\n".join(rows)
    pre += "\n\n![staleness vs workers](staleness_vs_workers.png)\n![loss](loss_vs_workers.png)"
    return write_seeded_report(sr, out, title="ASGD staleness against workers, AdamW on the "
                               "server (GPT)", target=0.0, preamble=pre,
                               command="phalanx experiments run gpt-staleness"
                               + (" --quick" if quick else "") + seeds_flag(seeds))


def _negate(d: Summary) -> Summary:
    """The paired difference the other way round (N minus N=1)."""
    return type(d)(d.n, -d.mean, d.sd, -d.high, -d.low)
