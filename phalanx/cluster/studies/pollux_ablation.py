"""Ablations of the learned goodput policy and of our ``pollux`` (issue 23), on the 8
Pollux workloads under ``--preset pollux-artifact``:

* goodput, learned profiles, priority ``none``, one change at a time from the default
  (a minimum gain of 0.1 for a change: a restart-aware hysteresis): no hysteresis (the
  policy on exactly Pollux's information and nothing added), 0.2, a bonus for GPU counts
  not run yet (``explore``), one model per application over all its jobs (``share``: a
  prior from similar jobs), growth to 4x the most GPUs run instead of 2x, speedup
  instead of progress units;
* ``pollux`` with 3 seeds of its genetic search and with a greedy search of the same
  objective (``--pollux-search greedy``: the power mean with p = -1 is a sum over jobs,
  so a marginal greedy applies).

    phalanx simulate --study pollux-ablation --out reports/cluster
    -> pollux_ablation.csv, pollux_ablation.md

Rows already in ``pollux_ablation.csv`` are reused (runs are deterministic for a seed);
delete it to recompute.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from phalanx.cluster.sim.run import SimulateOptions, apply_preset, load_inputs, simulate
from phalanx.cluster.studies.pollux_preset import ARTIFACT_POLLUX, Row, read_rows

VARIANTS: tuple[tuple[str, str, dict[str, object]], ...] = (
    ("goodput", "learned/none", {}),
    ("goodput", "min gain 0 (Pollux's information, no hysteresis)", {"learned": {"min_gain": 0.0}}),
    ("goodput", "min gain 0.2", {"learned": {"min_gain": 0.2}}),
    ("goodput", "explore 0.2", {"learned": {"explore": 0.2}}),
    ("goodput", "share (prior from same-application jobs)", {"learned": {"share": True}}),
    ("goodput", "growth 4x", {"learned": {"growth": 4.0}}),
    ("goodput", "speedup units", {"learned": {"speedup_units": True}}),
    ("goodput", "share + min gain 0.2 (the two that helped)",
     {"learned": {"share": True, "min_gain": 0.2}}),
    ("pollux", "learned", {"seed": 0}),
    ("pollux", "seed 1", {"seed": 1}),
    ("pollux", "seed 2", {"seed": 2}),
    ("pollux", "greedy search", {"pollux": {"search": "greedy"}}),
)
# other seeds of the GA (2-3 min a run here) on the first workloads only
SEED_WORKLOADS = (1, 2, 3)


def ablation_study(base: SimulateOptions, out: Path,
                   variants: tuple[tuple[str, str, dict[str, object]], ...] = VARIANTS
                   ) -> list[Row]:
    path = out / "pollux_ablation.csv"
    done = {}
    # the default policy and seed 0 are the main study's runs: reuse them
    for p in (out / "pollux_preset.csv", path):
        if p.exists():
            done.update({(r.workload, r.policy, r.variant): r for r in read_rows(p)})
    names = {(p, v) for p, v, _ in variants}
    rows: list[Row] = []
    for w in range(1, 9):
        given = {"trace": f"pollux:{w}", "data_dir": base.data_dir, "progress": False,
                 "goodput": {"priority": "none"}}
        opts = SimulateOptions.from_dict(apply_preset("pollux-artifact", given))
        inputs = None
        for policy, variant, kw in variants:
            if variant.startswith("seed ") and w not in SEED_WORKLOADS:
                continue
            hit = done.get((w, policy, variant))
            if hit is None:
                inputs = inputs or load_inputs(opts)
                s, _ = simulate(opts.merged({"ordering": policy, **kw}), inputs)
                hit = done[(w, policy, variant)] = Row(w, policy, variant, s.mean_jct_s,
                                                       s.finished, s.preemptions, s.wall_s)
                _write(path, {k: r for k, r in done.items()
                              if (r.policy, r.variant) in names})
            rows.append(hit)
        print(f"ablation, workload {w}: done", flush=True)
    _write(path, {(r.workload, r.policy, r.variant): r for r in rows})
    write_ablation_table(rows, out / "pollux_ablation.md")
    return rows


def _write(path: Path, done: dict) -> None:
    with path.open("w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["workload", "policy", "variant", "mean_jct_s", "finished",
                     "preemptions", "wall_s"])
        for r in sorted(done.values(), key=lambda r: (r.policy, r.variant, r.workload)):
            wr.writerow([r.workload, r.policy, r.variant, f"{r.mean_jct_s:.1f}", r.finished,
                         r.preemptions, f"{r.wall_s:.2f}"])


def write_ablation_table(rows: list[Row], path: Path) -> None:
    by: dict[tuple[str, str], dict[int, Row]] = {}
    for r in rows:
        by.setdefault((r.policy, r.variant), {})[r.workload] = r
    ref = by.get(("pollux", "learned"))
    lines = ["| policy | variant | " + " | ".join(f"w{w}" for w in range(1, 9))
             + " | mean | vs our pollux (seed 0) | vs artifact Pollux | median wall s |",
             "|---|---|" + "---|" * 12]
    art = float(np.mean(ARTIFACT_POLLUX))
    for (policy, variant), per in by.items():
        if len(per) < 8:
            continue
        jct = [per[w].mean_jct_s for w in range(1, 9)]
        mean = float(np.mean(jct))
        vs = (f"{mean / float(np.mean([ref[w].mean_jct_s for w in range(1, 9)])):.3f}"
              if ref and len(ref) == 8 else "-")
        wall = float(np.median([per[w].wall_s for w in range(1, 9)]))
        lines.append(f"| {policy} | {variant} | " + " | ".join(f"{v:,.0f}" for v in jct)
                     + f" | **{mean:,.0f}** | {vs} | {mean / art:.3f} | {wall:.1f} |")
    seeds = [by.get(("pollux", "learned" if k == 0 else f"seed {k}")) for k in range(3)]
    extra = ""
    if all(s and all(w in s for w in SEED_WORKLOADS) for s in seeds):
        lines2 = ["| workload | seed 0 | seed 1 | seed 2 | spread (max - min) / mean |",
                  "|---|---|---|---|---|"]
        for w in SEED_WORKLOADS:
            v = [s[w].mean_jct_s for s in seeds]
            lines2.append(f"| {w} | " + " | ".join(f"{x:,.0f}" for x in v)
                          + f" | {(max(v) - min(v)) / np.mean(v):.3f} |")
        extra = ("\n\nOur pollux, 3 seeds of its genetic search (workloads "
                 f"{', '.join(map(str, SEED_WORKLOADS))}; 2-3 min a run here):\n\n"
                 + "\n".join(lines2) + "\n")
    path.write_text("Mean JCT (s), 8 Pollux workloads, `--preset pollux-artifact`, learned "
                    "profiles (what Pollux knows), priority none; each goodput row changes "
                    "one option of the default (`learned/none`: min gain 0.1); pollux "
                    "`learned` is seed 0 of its search:\n\n"
                    + "\n".join(lines) + extra + "\n")
