"""Claim 6: the SSP staleness bound s and the soft-sync n trade waiting for freshness;
measured as time to a target accuracy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from phalanx.experiments.common import base_config, variant, verdict_block
from phalanx.experiments.seeds import run_seeded, write_seeded_report
from phalanx.experiments.stats import FAILS, HOLDS, combine, compare_higher, summarize


def run(out: Path, *, quick: bool, data: str | None, seeds: Sequence[int],
        reuse: bool = False) -> Path:
    n = 4
    bounds = (0, 4) if quick else (0, 1, 3, 10)
    softs = (1, 4) if quick else (1, 2, 4)
    target = 0.5 if quick else 0.8

    def make(seed: int, folder: Path):
        base = base_config(folder, quick=quick, data=data, seed=seed, workers=n, servers=1,
                           rule="sgd", lr=0.05, slow_workers={0: 2.0}, eval_every=0)
        if not quick:  # about a minute per run on 2 busy shared cores
            base.train_limit, base.test_limit = 20000, 5000
        return ([variant(base, folder, f"ssp s={s}", strategy="ssp", staleness=s)
                 for s in bounds]
                + [variant(base, folder, f"softsync n={k}", strategy="softsync", softsync=k)
                   for k in softs])

    sr = run_seeded(make, out, seeds, reuse=reuse)
    ssp = [f"ssp s={s}" for s in bounds]
    soft = [f"softsync n={k}" for k in softs]
    rows = ["| run | time to target (s) | final accuracy (mean ± sd) | staleness mean | "
            "staleness max (all seeds) |", "|---|---|---|---|---|"]
    for label in sr.labels:
        times = [r.time_to(target) for r in sr.runs[label]]
        hit = [t for t in times if t is not None]
        t_cell = (summarize(hit).fmt(".1f") if hit else "—") + (
            "" if len(hit) == len(times) else f" ({len(hit)}/{len(times)} reached)")
        rows.append(f"| {label} | {t_cell} | {sr.stat(label).fmt()} | "
                    f"{sr.stat(label, 'staleness_mean').fmt('.2f')} | "
                    f"{max(int(v) for v in sr.values(label, 'staleness_max'))} |")
    # the bound is a guarantee, checked in every run of every seed (exact)
    worst = [max(int(v) for v in sr.values(label, "staleness_max")) for label in ssp]
    bound = HOLDS if all(m <= (s + 1) * n for m, s in zip(worst, bounds)) else FAILS
    more = compare_higher(sr.values(ssp[-1], "staleness_mean"),
                          sr.values(ssp[0], "staleness_mean"))
    fresher = compare_higher(sr.values(soft[0], "staleness_mean"),
                             sr.values(soft[-1], "staleness_mean"))
    measured = ("SSP max staleness " + ", ".join(f"{m} at s={s}" for m, s in zip(worst, bounds))
                + f" (bound (s+1)·N respected in every run: {bound}); mean staleness s="
                f"{bounds[-1]} above s={bounds[0]}: {more.word} ({more.basis}); soft-sync mean "
                "staleness " + ", ".join(f"{sr.stat(label, 'staleness_mean').fmt('.2f')} at n={k}"
                                         for k, label in zip(softs, soft))
                + f", n={softs[0]} above n={softs[-1]}: {fresher.word} ({fresher.basis}).")
    pre = verdict_block("a larger SSP bound lets fast workers run ahead (more staleness, less "
                        "waiting, never past the bound); soft-sync n averages n pushes per "
                        "update (fresher: n=1 is ASGD)", measured,
                        combine([bound, more, fresher]))
    pre += ("\n\nSet-up: " + ("MLP on 2,000 synthetic samples, 1 epoch" if quick else
                              "LeNet-5 on the first 20,000 Fashion-MNIST training images "
                              "(5,000 test images), 2 epochs")
            + f", {n} workers (worker 0 2x slower), plain SGD lr 0.05, batch 32.")
    pre += "\n\n" + "\n".join(rows)
    seeds_flag = f" --seeds {','.join(map(str, seeds))}" if len(seeds) > 1 else ""
    return write_seeded_report(sr, out, title="SSP bound and soft-sync sweep", target=target,
                               preamble=pre, command="phalanx experiments run ssp-softsync"
                               + (" --quick" if quick else "") + seeds_flag)
