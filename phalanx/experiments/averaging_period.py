"""Claim 2: the averaging period k trades accuracy for traffic (bytes fall about as 1/k)."""

from __future__ import annotations

from pathlib import Path

from phalanx.experiments.common import base_config, variant, verdict_block
from phalanx.experiments.compare import run_variants, write_report
from phalanx.metrics import plots


def run(out: Path, *, quick: bool, data: str | None, seed: int) -> Path:
    n = 4
    periods = (1, 4, 16) if quick else (1, 4, 16, 64)
    base = base_config(out, quick=quick, data=data, seed=seed, strategy="average", workers=n,
                       rule="sgd", lr=0.05)
    runs = run_variants([variant(base, out, f"k={k}", period=k) for k in periods])
    out.mkdir(parents=True, exist_ok=True)
    bps = [float(r.summary.get("bytes_per_sample", 0.0)) for r in runs]
    accs = [r.summary["test_accuracy"] for r in runs]
    plots.line_plot(out / "accuracy_vs_bytes.png",
                    {"parameter averaging": (bps, accs)}, xlabel="bytes moved per sample",
                    ylabel="final test accuracy", logx=True,
                    title=f"Averaging period k = {', '.join(map(str, periods))} (N={n})")
    rows = ["| k | test accuracy | bytes/sample | bytes vs k=1 |", "|---|---|---|---|"]
    for k, a, b in zip(periods, accs, bps):
        rows.append(f"| {k} | {a:.4f} | {b:.0f} | {b / bps[0]:.3f} (1/k = {1 / k:.3f}) |")
    ratio_last = bps[-1] / bps[0] if bps[0] else float("nan")
    measured = (f"from k=1 to k={periods[-1]} traffic per sample fell to {ratio_last:.3f} of "
                f"k=1 (1/k = {1 / periods[-1]:.3f}) while test accuracy went "
                f"{accs[0]:.4f} -> {accs[-1]:.4f}.")
    holds = bps[0] > 0 and all(b2 < b1 for b1, b2 in zip(bps, bps[1:]))
    pre = verdict_block("a longer averaging period moves fewer bytes (about 1/k) at some cost "
                        "in accuracy per sample", measured, holds)
    pre += "\n\n" + "\n".join(rows) + "\n\n![accuracy vs bytes](accuracy_vs_bytes.png)"
    return write_report(runs, out, title="Averaging period sweep", target=0.5 if quick else 0.8,
                        preamble=pre, command="phalanx experiments run averaging-period"
                        + (" --quick" if quick else ""))
