"""Claim 3: with N asynchronous workers the mean staleness of an applied gradient is about
the number of workers (N - 1 other workers push between a pull and the push)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from phalanx.experiments.common import base_config, variant, verdict_block
from phalanx.experiments.seeds import SeededRuns, run_seeded, write_seeded_report
from phalanx.experiments.stats import FAILS, HOLDS, INCONCLUSIVE, combine, compare_higher, summarize
from phalanx.metrics import plots

BAND = (0.5, 1.5)  # "about N - 1": a fitted slope of mean staleness on N - 1 in this band


def _slope(sizes: Sequence[int], means: Sequence[float]) -> float:
    """Least-squares slope of mean staleness on N - 1, through the origin."""
    xs = [n - 1 for n in sizes]
    return sum(x * m for x, m in zip(xs, means)) / sum(x * x for x in xs)


def _slope_verdict(slopes: Sequence[float]) -> tuple[str, str]:
    s = summarize(slopes)
    if s.n < 2:
        return INCONCLUSIVE, f"slope {s.mean:.2f} from one seed: no interval"
    lo, hi = BAND
    if lo <= s.low and s.high <= hi:
        return HOLDS, f"95% interval of the slope {s.fmt_ci('.2f')} inside [{lo}, {hi}]"
    if s.high < lo or s.low > hi:
        return FAILS, f"95% interval of the slope {s.fmt_ci('.2f')} outside [{lo}, {hi}]"
    return INCONCLUSIVE, f"95% interval of the slope {s.fmt_ci('.2f')} straddles [{lo}, {hi}]"


def run(out: Path, *, quick: bool, data: str | None, seeds: Sequence[int],
        reuse: bool = False) -> Path:
    sizes = (2, 4) if quick else (2, 4, 8)

    def make(seed: int, folder: Path):
        base = base_config(folder, quick=quick, data=data, seed=seed, strategy="asp",
                           servers=1, rule="sgd", lr=0.02, epochs=1)
        if not quick:  # staleness needs pushes, not accuracy: 250 per worker-set, one eval
            base.train_limit, base.test_limit, base.eval_every = 8000, 1000, 10**6
        return [variant(base, folder, f"asp N={n}", workers=n) for n in sizes]

    sr: SeededRuns = run_seeded(make, out, seeds, reuse=reuse)
    labels = [f"asp N={n}" for n in sizes]
    means = [sr.stat(label, "staleness_mean") for label in labels]
    slopes = [_slope(sizes, [sr.values(label, "staleness_mean")[i] for label in labels])
              for i in range(len(sr.seeds))]
    out.mkdir(parents=True, exist_ok=True)
    plots.band_plot(out / "staleness_vs_workers.png",
                    {"measured mean staleness": (list(sizes), [m.mean for m in means],
                                                 [m.low if m.n > 1 else m.mean for m in means],
                                                 [m.high if m.n > 1 else m.mean for m in means]),
                     "N - 1": (list(sizes), [n - 1 for n in sizes], [n - 1 for n in sizes],
                               [n - 1 for n in sizes])},
                    xlabel="workers N", ylabel="mean staleness (server updates)",
                    title="ASGD staleness against the number of workers")
    rows = ["| N | mean staleness (mean ± sd over seeds) | 95% CI | max staleness | N - 1 | "
            "mean / (N - 1) |", "|---|---|---|---|---|---|"]
    for n, label, m in zip(sizes, labels, means):
        mx = max(int(v) for v in sr.values(label, "staleness_max"))
        rows.append(f"| {n} | {m.fmt('.2f')} | {m.fmt_ci('.2f')} | {mx} | {n - 1} | "
                    f"{m.mean / (n - 1):.2f} |")
    growth = [compare_higher(sr.values(b, "staleness_mean"), sr.values(a, "staleness_mean"))
              for a, b in zip(labels, labels[1:])]
    slope_word, slope_basis = _slope_verdict(slopes)
    overall = combine([*growth, slope_word])
    measured = ("mean staleness " + ", ".join(f"{m.fmt('.2f')} at N={n}"
                                              for n, m in zip(sizes, means))
                + f"; least-squares fit per seed: mean staleness = "
                f"{summarize(slopes).fmt('.2f')} x (N - 1). Growth with N: "
                + "; ".join(f"N={b} over N={a}: {v.word} ({v.basis})" for a, b, v in
                            zip(sizes, sizes[1:], growth))
                + f". Slope: {slope_word} ({slope_basis}).")
    pre = verdict_block(f"mean staleness grows with N, about N - 1 (fitted slope in "
                        f"[{BAND[0]}, {BAND[1]}])", measured, overall)
    pre += ("\n\nSet-up: " + ("MLP on 2,000 synthetic samples" if quick else
                               "LeNet-5 on the first 8,000 Fashion-MNIST images (staleness "
                               "needs pushes, not accuracy; one evaluation at the end)")
            + ", 1 epoch, ASGD, plain SGD lr 0.02, batch 32, 1 server shard.")
    pre += ("\n\nWhy below N - 1 here: the N workers and the server share 2 CPU cores, so a "
            "worker often pushes twice in a row while its peers wait for a core; with N "
            "workers on N free cores the pushes interleave round-robin and the mean tends "
            "to N - 1.")
    pre += "\n\n" + "\n".join(rows) + "\n\n![staleness vs workers](staleness_vs_workers.png)"
    seeds_flag = f" --seeds {','.join(map(str, seeds))}" if len(seeds) > 1 else ""
    return write_seeded_report(sr, out, title="ASGD staleness against the number of workers",
                               target=0.5 if quick else 0.8, preamble=pre,
                               command="phalanx experiments run staleness-vs-workers"
                               + (" --quick" if quick else "") + seeds_flag)
