"""Claim 6: the SSP staleness bound s and the soft-sync n trade waiting for freshness;
measured as time to a target accuracy."""

from __future__ import annotations

from pathlib import Path

from phalanx.experiments.common import base_config, variant, verdict_block
from phalanx.experiments.compare import run_variants, write_report


def run(out: Path, *, quick: bool, data: str | None, seed: int) -> Path:
    n = 4
    bounds = (0, 4) if quick else (0, 1, 3, 10)
    softs = (1, 4) if quick else (1, 2, 4)
    target = 0.5 if quick else 0.8
    base = base_config(out, quick=quick, data=data, seed=seed, workers=n, servers=1,
                       rule="sgd", lr=0.05, slow_workers={0: 2.0}, eval_every=0)
    variants = [variant(base, out, f"ssp s={s}", strategy="ssp", staleness=s) for s in bounds]
    variants += [variant(base, out, f"softsync n={k}", strategy="softsync", softsync=k)
                 for k in softs]
    runs = run_variants(variants)
    rows = ["| run | time to target (s) | final accuracy | staleness mean | staleness max |",
            "|---|---|---|---|---|"]
    for r in runs:
        t = r.time_to(target)
        rows.append(f"| {r.label} | {'—' if t is None else f'{t:.1f}'} | "
                    f"{r.summary['test_accuracy']:.4f} | {r.summary.get('staleness_mean', 0):.2f} "
                    f"| {r.summary.get('staleness_max', 0)} |")
    ssp_max = [r.summary.get("staleness_max", 0) for r in runs[: len(bounds)]]
    bound_ok = all(m <= (s + 1) * n for m, s in zip(ssp_max, bounds))
    measured = ("SSP max staleness " + ", ".join(f"{m} at s={s}" for m, s in zip(ssp_max, bounds))
                + "; soft-sync mean staleness " + ", ".join(
                    f"{r.summary.get('staleness_mean', 0):.2f} at n={k}"
                    for k, r in zip(softs, runs[len(bounds):])) + ".")
    pre = verdict_block("a larger SSP bound lets fast workers run ahead (more staleness, less "
                        "waiting); soft-sync n averages n pushes per update (n=1 is ASGD)",
                        measured, bound_ok)
    pre += "\n\n" + "\n".join(rows)
    return write_report(runs, out, title="SSP bound and soft-sync sweep", target=target,
                        preamble=pre, command="phalanx experiments run ssp-softsync"
                        + (" --quick" if quick else ""))
