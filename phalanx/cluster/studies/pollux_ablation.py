"""The goodput policy's options and our ``pollux``'s search on the 8 Pollux workloads
under ``--preset pollux-artifact`` (issues 23 and 48):

* goodput, learned profiles (one policy on every cluster: ``goodput_typed.py``; a Pollux
  cluster is one of one GPU type), one option of the ``typed`` section changed at a time
  from the default, on the *tuning* workloads 1 and 7 only (``TUNE``); the default runs
  on all 8 (the preset study's row), so workloads 2-6 and 8 are held out;
* ``pollux`` with 3 seeds of its genetic search and with a greedy search of the same
  objective (``--pollux-search greedy``: the power mean with p = -1 is a sum over jobs,
  so a marginal greedy applies).

    phalanx simulate --study pollux-ablation --out reports/cluster
    -> pollux_ablation.csv, pollux_ablation.md

Rows already in ``pollux_ablation.csv`` (or, for the defaults, ``pollux_preset.csv``) are
reused (runs are deterministic for a seed); delete them to recompute.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from phalanx.cluster.sim.run import SimulateOptions, apply_preset, load_inputs, simulate
from phalanx.cluster.studies.pollux_preset import ARTIFACT_POLLUX, Row, read_rows

# the goodput policy was tuned on these Pollux workloads only (issue 48)
TUNE = (1, 7)
DEFAULT = ("goodput", "learned/none")
VARIANTS: tuple[tuple[str, str, dict[str, object]], ...] = (
    (*DEFAULT, {}),
    ("goodput", "p -0.5 (Sia's)", {"typed": {"p": -0.5}}),
    ("goodput", "p -0.1", {"typed": {"p": -0.1}}),
    ("goodput", "start 1 GPU (Sia's, Pollux's)", {"typed": {"start": 1}}),
    ("goodput", "min gain 0.1", {"typed": {"min_gain": 0.1}}),
    ("goodput", "min gain 0.3", {"typed": {"min_gain": 0.3}}),
    ("goodput", "min gain 0.5", {"typed": {"min_gain": 0.5}}),
    ("goodput", "min gain 0.4", {"typed": {"min_gain": 0.4}}),
    ("goodput", "min gain 0.7", {"typed": {"min_gain": 0.7}}),
    ("goodput", "min gain 1.0", {"typed": {"min_gain": 1.0}}),
    ("goodput", "growth 2x (Pollux's)", {"typed": {"growth": 2.0}}),
    ("goodput", "growth 4x", {"typed": {"growth": 4.0}}),
    ("goodput", "lambda_n 1.5", {"typed": {"lambda_n": 1.5}}),
    ("goodput", "restart horizon from attained service", {"typed": {"restart": "attained"}}),
    ("goodput", "share (prior from same-application jobs)", {"typed": {"share": True}}),
    ("goodput", "priority las", {"goodput": {"priority": "las"}}),
    ("pollux", "learned", {"seed": 0}),
    ("pollux", "seed 1", {"seed": 1}),
    ("pollux", "seed 2", {"seed": 2}),
    ("pollux", "greedy search", {"pollux": {"search": "greedy"}}),
)
# other seeds of the GA (2-3 min a run here) on the first workloads only
SEED_WORKLOADS = (1, 2, 3)


def workloads_of(policy: str, variant: str) -> tuple[int, ...]:
    """The workloads a variant runs on: a goodput option only on the tuning ones."""
    if policy == "goodput" and (policy, variant) != DEFAULT:
        return TUNE
    return SEED_WORKLOADS if variant.startswith("seed ") else tuple(range(1, 9))


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
            if w not in workloads_of(policy, variant):
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
    art = float(np.mean(ARTIFACT_POLLUX))
    lines = ["| policy | variant | " + " | ".join(f"w{w}" for w in range(1, 9))
             + " | mean | vs our pollux (seed 0) | vs artifact Pollux | median wall s |",
             "|---|---|" + "---|" * 12]
    held = [w for w in range(1, 9) if w not in TUNE]
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
    tune = ["| goodput variant | " + " | ".join(f"w{w}" for w in TUNE)
            + " | mean | vs default | vs our pollux |", "|---|" + "---|" * (len(TUNE) + 3)]
    base = by.get(DEFAULT)
    for (policy, variant), per in by.items():
        if policy != "goodput" or not all(w in per for w in TUNE) or not base \
                or not ref or not all(w in base and w in ref for w in TUNE):
            continue
        m = float(np.mean([per[w].mean_jct_s for w in TUNE]))
        m0 = float(np.mean([base[w].mean_jct_s for w in TUNE]))
        mp = float(np.mean([ref[w].mean_jct_s for w in TUNE]))
        tune.append(f"| {variant} | " + " | ".join(f"{per[w].mean_jct_s:,.0f}" for w in TUNE)
                    + f" | {m:,.0f} | {m / m0:.3f} | {m / mp:.3f} |")
    held_line = ""
    if base and ref and all(w in base and w in ref for w in range(1, 9)):
        r = float(np.mean([base[w].mean_jct_s for w in held])) / float(
            np.mean([ref[w].mean_jct_s for w in held]))
        held_line = (f"\nOn the held-out workloads ({', '.join(map(str, held))}) the "
                     f"default is {r:.3f}x our pollux (mean JCT).\n")
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
                    "profiles (what Pollux knows); goodput `learned/none` is the default "
                    "goodput policy, pollux `learned` seed 0 of its search:\n\n"
                    + "\n".join(lines) + "\n" + held_line
                    + "\nThe goodput policy's options, one at a time, on the tuning workloads "
                    f"({', '.join(map(str, TUNE))}) only:\n\n" + "\n".join(tune) + extra
                    + "\n")
