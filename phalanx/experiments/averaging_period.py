"""Claim 2: the averaging period k trades accuracy for traffic (bytes fall about as 1/k)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from phalanx.experiments.common import base_config, variant, verdict_block
from phalanx.experiments.seeds import run_seeded, write_seeded_report
from phalanx.experiments.stats import FAILS, HOLDS, combine, compare_higher
from phalanx.metrics import plots


def run(out: Path, *, quick: bool, data: str | None, seeds: Sequence[int],
        reuse: bool = False) -> Path:
    n = 4
    periods = (1, 4, 16) if quick else (1, 4, 16, 64)

    def make(seed: int, folder: Path):
        base = base_config(folder, quick=quick, data=data, seed=seed, strategy="average",
                           workers=n, rule="sgd", lr=0.05)
        if not quick:  # about a minute per run on 2 busy shared cores
            base.train_limit, base.test_limit = 20000, 5000
        return [variant(base, folder, f"k={k}", period=k) for k in periods]

    sr = run_seeded(make, out, seeds, reuse=reuse)
    labels = [f"k={k}" for k in periods]
    out.mkdir(parents=True, exist_ok=True)
    bps = [sr.stat(label, "bytes_per_sample").mean for label in labels]
    accs = [sr.stat(label) for label in labels]
    plots.band_plot(out / "accuracy_vs_bytes.png",
                    {"parameter averaging": (bps, [a.mean for a in accs],
                                             [a.low if a.n > 1 else a.mean for a in accs],
                                             [a.high if a.n > 1 else a.mean for a in accs])},
                    xlabel="bytes moved per sample", ylabel="final test accuracy", logx=True,
                    title=f"Averaging period k = {', '.join(map(str, periods))} (N={n})")
    rows = ["| k | test accuracy (mean ± sd) | 95% CI | bytes/sample | bytes vs k=1 |",
            "|---|---|---|---|---|"]
    for k, a, b in zip(periods, accs, bps):
        rows.append(f"| {k} | {a.fmt()} | {a.fmt_ci()} | {b:.0f} | {b / bps[0]:.3f} "
                    f"(1/k = {1 / k:.3f}) |")
    ratio_last = bps[-1] / bps[0] if bps[0] else float("nan")
    # byte counts are exact (the same in every seed): a plain comparison decides them
    fewer = HOLDS if bps[0] > 0 and all(b2 < b1 for b1, b2 in zip(bps, bps[1:])) else FAILS
    cost = compare_higher(sr.values(labels[0]), sr.values(labels[-1]))
    measured = (f"from k=1 to k={periods[-1]} traffic per sample fell to {ratio_last:.3f} of "
                f"k=1 (1/k = {1 / periods[-1]:.3f}; exact: {fewer}); test accuracy "
                f"{accs[0].fmt()} -> {accs[-1].fmt()}: k=1 above k={periods[-1]} "
                f"{cost.word} ({cost.basis}).")
    pre = verdict_block("a longer averaging period moves fewer bytes (about 1/k) at some cost "
                        "in accuracy", measured, combine([fewer, cost]))
    pre += ("\n\nSet-up: " + ("MLP on 2,000 synthetic samples, 1 epoch" if quick else
                              "LeNet-5 on the first 20,000 Fashion-MNIST training images "
                              "(5,000 test images), 2 epochs")
            + f", {n} workers, plain SGD lr 0.05, batch 32.")
    pre += "\n\n" + "\n".join(rows) + "\n\n![accuracy vs bytes](accuracy_vs_bytes.png)"
    seeds_flag = f" --seeds {','.join(map(str, seeds))}" if len(seeds) > 1 else ""
    return write_seeded_report(sr, out, title="Averaging period sweep",
                               target=0.5 if quick else 0.8, preamble=pre,
                               command="phalanx experiments run averaging-period"
                               + (" --quick" if quick else "") + seeds_flag)
