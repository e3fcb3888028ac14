"""The Sia comparison (``phalanx simulate --study sia --out DIR``, issue 35) under
``--preset sia-artifact`` on Sia's 64-GPU cluster (6 aws x 4 T4, 3 rtx x 8 2080Ti,
2 dgx-ext x 8 A100): per workload (philly 1-8, saturn 1-10) the Sia artifact's own
simulator's mean JCT where it was run here (``reference.jsonl``), our ``sia``, ``pollux``
(heterogeneity-unaware) and ``gavel``, and our ``goodput`` policy on equal information;
then ours against our ``sia`` on the test workloads (philly 5-8, all of saturn; philly 1-4
were used for tuning) at 1.0x and 1.5x load: mean and p99 JCT, GPU-hours, restarts per
job.

Our goodput's ablations (``ABLATIONS``: each label says what it changes) run on the
tuning workloads. The artifact's figures are read from ``reference.jsonl`` in the study's
folder.

    -> DIR/sia/sia.csv (one row per run, with the commit that ran it and the options as
       resolved; rows already there are reused: delete to recompute), DIR/sia/sia.md
"""

from __future__ import annotations

import csv
import json
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from phalanx.cluster.sim.run import SimulateOptions, apply_preset, load_inputs, simulate
from phalanx.cluster.studies.provenance import commit, resolved
from phalanx.errors import DataError

WORKLOADS = tuple(f"sia:philly:{w}" for w in range(1, 9)) + tuple(
    f"sia:saturn:{w}" for w in range(1, 11))
TUNE = tuple(f"sia:philly:{w}" for w in range(1, 5))
TEST = tuple(w for w in WORKLOADS if w not in TUNE)
# (label, options): the reference policies as Sia ran them, and ours
RUNS: tuple[tuple[str, dict[str, object]], ...] = (
    ("sia", {"ordering": "sia"}),
    ("pollux", {"ordering": "pollux"}),
    ("gavel", {"ordering": "gavel", "interval_s": 360.0}),
    ("goodput", {"ordering": "goodput"}),
)
LOADS = (1.0, 1.5)
# our heterogeneity-unaware pollux runs where it has something to be compared with: the
# artifact's Pollux never finished a workload here, and its jobs finished on philly 1 are
# compared with ours by pollux_partial.py (a run of ours: 4-16 min on this machine)
POLLUX_WORKLOADS = ("sia:philly:1",)

# The Sia artifact's own simulator (siasosp23/artifacts, sia-simulator/multi_simulator*.py
# with run_experiment.sh's flags), run here in a scratch venv (numpy 1.23, pandas 1.5,
# pymoo 0.4.2.1, cvxpy with CBC and ECOS) one workload at a time: reference.jsonl in the
# study's folder holds each run (mean JCT and per-application figures; run_reference.sh
# and ref_extract.py made it). Sia and Gavel were run on all 18 workloads (a Sia run 6-22
# min here); the artifact's Pollux (a genetic search every 60 s round) had not finished
# philly 1 after 90 minutes, nor in a second run (README.md there).
REFERENCE_FILE = "reference.jsonl"
# ablations of our goodput policy the docs quote, on the tuning workloads at load 1.0:
# (label, sections changed); the label says what runs
ABLATIONS: tuple[tuple[str, dict[str, object]], ...] = (
    ("goodput p -0.5 (Sia's)", {"typed": {"p": -0.5}}),
    ("goodput start 1 GPU (Sia's)", {"typed": {"start": 1}}),
    ("goodput growth 2x (Sia's)", {"typed": {"growth": 2.0}}),
    ("goodput min gain 0.1", {"typed": {"min_gain": 0.1}}),
    ("goodput min gain 0.2 (before 2026-11-29)", {"typed": {"min_gain": 0.2}}),
    ("goodput restart horizon from attained service", {"typed": {"restart": "attained"}}),
    ("goodput per-application priors (more than Sia sees)", {"typed": {"share": True}}),
    ("goodput offline-fit ablation (every measured profile)",
     {"typed": {"knowledge": "offline-fit"}}),
    ("goodput oracle ablation (the simulator's own table)", {"typed": {"knowledge": "oracle"}}),
)


def read_reference(path: Path) -> dict[tuple[str, str], float]:
    """``{(policy, workload): mean JCT s}`` from the reference runs' file (one line naming
    the file and line for a missing file or a bad line)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise DataError(f"{path}: cannot read the Sia reference runs ({e.strerror})") from None
    out = {}
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            out[(str(rec["policy"]), str(rec["trace"]))] = float(rec["mean_jct_s"])
        except (ValueError, KeyError, TypeError):
            raise DataError(f"{path}:{n}: not a reference run (JSON with policy, trace, "
                            f"mean_jct_s)") from None
    return out


@dataclass(frozen=True)
class Row:
    """One run in ``sia.csv``."""

    workload: str
    policy: str
    load: float
    mean_jct_s: float
    p99_jct_s: float
    gpu_h: float
    restarts_per_job: float
    finished: int
    wall_s: float
    commit: str = ""       # the code that ran (studies/provenance.py)
    options: str = ""      # the options as resolved, every section (JSON)


def run_one(workload: str, label: str, kw: dict[str, object], load: float,
            base: SimulateOptions) -> Row:
    given = {"trace": workload, "data_dir": base.data_dir, "progress": False,
             "load_scale": load, **kw}
    opts = SimulateOptions.from_dict(apply_preset("sia-artifact", given))
    s, res = simulate(opts, load_inputs(opts))
    jcts = [st.end - st.spec.submit for st in res.jobs if st.end >= 0]
    return Row(workload, label, load, s.mean_jct_s, float(np.percentile(jcts, 99)),
               sum(st.attained for st in res.jobs) / 3600.0,
               float(np.mean([max(len(st.placements) - 1, 0) for st in res.jobs])),
               s.finished, s.wall_s, commit(), resolved(opts))


def _tasks() -> list[tuple[str, str, dict[str, object], float]]:
    """Every run of the study, in table order: (workload, label, options, load)."""
    out = []
    for w in WORKLOADS:
        runs = RUNS + (tuple((label, {"ordering": "goodput", **kw}) for label, kw in ABLATIONS)
                       if w in TUNE else ())
        for label, kw in runs:
            if label == "pollux" and w not in POLLUX_WORKLOADS:
                continue
            for load in LOADS:
                if load != 1.0 and (w not in TEST or label not in ("sia", "goodput")):
                    continue
                out.append((w, label, kw, load))
    return out


def sia_study(base: SimulateOptions, out: Path, workers: int = 0) -> list[Row]:
    """Every run into ``out/sia/`` (beside the reference runs it reads); rows already in
    ``sia.csv`` are reused (runs are deterministic), so delete it to recompute after a model
    or policy change. Runs go to ``workers`` processes (0: up to 4, one per core); the
    files are rewritten after each run, so an interrupted study resumes where it stopped."""
    folder = out / "sia"
    folder.mkdir(parents=True, exist_ok=True)
    reference = read_reference(folder / REFERENCE_FILE)
    path = folder / "sia.csv"
    done = {(r.workload, r.policy, r.load): r for r in read_rows(path)} \
        if path.exists() else {}
    tasks = _tasks()
    order = {(w, label, load): i for i, (w, label, _, load) in enumerate(tasks)}

    def save() -> None:
        write_outputs(sorted(done.values(), key=lambda r: order.get(
            (r.workload, r.policy, r.load), len(order))), folder, reference)

    # the long runs first (pollux's search, sia's MILP), so the pool ends together
    todo = sorted((t for t in tasks if (t[0], t[1], t[3]) not in done),
                  key=lambda t: {"pollux": 0, "sia": 1}.get(t[1], 2))
    print(f"sia study: {len(tasks) - len(todo)} of {len(tasks)} runs in {path}, "
          f"{len(todo)} to run", flush=True)
    workers = workers or min(4, os.cpu_count() or 1)
    with ProcessPoolExecutor(workers) as pool:
        futures = [pool.submit(run_one, w, label, kw, load, base) for w, label, kw, load in todo]
        for n, fut in enumerate(as_completed(futures), start=1):
            r = fut.result()
            done[(r.workload, r.policy, r.load)] = r
            save()
            print(f"sia study: {n}/{len(todo)} {r.workload} {r.policy} x{r.load}: mean JCT "
                  f"{r.mean_jct_s:,.0f} s ({r.wall_s:.0f} s)", flush=True)
    save()
    return [done[(w, label, load)] for w, label, _, load in tasks]


def read_rows(path: Path) -> list[Row]:
    with path.open(newline="") as f:
        return [Row(r["workload"], r["policy"], float(r["load"]), float(r["mean_jct_s"]),
                    float(r["p99_jct_s"]), float(r["gpu_h"]), float(r["restarts_per_job"]),
                    int(r["finished"]), float(r["wall_s"]), r.get("commit", ""),
                    r.get("options", "")) for r in csv.DictReader(f)]


def write_outputs(rows: list[Row], folder: Path,
                  reference: dict[tuple[str, str], float]) -> None:
    with (folder / "sia.csv").open("w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["workload", "policy", "load", "mean_jct_s", "p99_jct_s", "gpu_h",
                     "restarts_per_job", "finished", "wall_s", "commit", "options"])
        for r in rows:
            wr.writerow([r.workload, r.policy, r.load, f"{r.mean_jct_s:.1f}",
                         f"{r.p99_jct_s:.1f}", f"{r.gpu_h:.2f}", f"{r.restarts_per_job:.3f}",
                         r.finished, f"{r.wall_s:.1f}", r.commit, r.options])
    (folder / "sia.md").write_text(render(rows, reference))


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f}"


def render(rows: list[Row], reference: dict[tuple[str, str], float]) -> str:
    """The study's tables (markdown); ``reference``: the artifact's runs' mean JCT."""
    by = {(r.workload, r.policy, r.load): r for r in rows}
    head = ("| workload | ref sia | our sia | ratio | ref pollux | our pollux | ratio "
            "| ref gavel | our gavel | ratio | goodput (equal info) | goodput / our sia |")
    lines = [head, "|---" * 12 + "|"]
    for w in WORKLOADS:
        cells = [w.removeprefix("sia:")]
        ours_sia = by.get((w, "sia", 1.0))
        for pol in ("sia", "pollux", "gavel"):
            ref = reference.get((pol, w))
            ours = by.get((w, pol, 1.0))
            cells += [_fmt(ref), _fmt(ours.mean_jct_s if ours else None),
                      f"{ours.mean_jct_s / ref:.3f}" if ours and ref else "n/a"]
        g = by.get((w, "goodput", 1.0))
        cells += [_fmt(g.mean_jct_s if g else None),
                  f"{g.mean_jct_s / ours_sia.mean_jct_s:.3f}" if g and ours_sia else "n/a"]
        if any(c != "n/a" for c in cells[1:]):
            lines.append("| " + " | ".join(cells) + " |")
    test = ["| workloads | load | sia mean JCT | goodput mean JCT | ratio | sia p99 | "
            "goodput p99 | sia GPU-h | goodput GPU-h | sia restarts/job | "
            "goodput restarts/job |", "|---" * 11 + "|"]
    for name, ws in (("tune: philly 1-4", TUNE), ("test: philly 5-8", TEST[:4]),
                     ("test: saturn 1-10", TEST[4:])):
        for load in LOADS:
            pairs = [(by.get((w, "sia", load)), by.get((w, "goodput", load))) for w in ws]
            pairs = [(a, b) for a, b in pairs if a and b]
            if not pairs:
                continue
            s_, g_ = zip(*pairs)

            def m(rs, f):
                return float(np.mean([f(r) for r in rs]))
            test.append(
                f"| {name} ({len(pairs)}) | {load} | {m(s_, lambda r: r.mean_jct_s):,.0f} | "
                f"{m(g_, lambda r: r.mean_jct_s):,.0f} | "
                f"{m(g_, lambda r: r.mean_jct_s) / m(s_, lambda r: r.mean_jct_s):.3f} | "
                f"{m(s_, lambda r: r.p99_jct_s):,.0f} | {m(g_, lambda r: r.p99_jct_s):,.0f} | "
                f"{m(s_, lambda r: r.gpu_h):,.1f} | {m(g_, lambda r: r.gpu_h):,.1f} | "
                f"{m(s_, lambda r: r.restarts_per_job):.2f} | "
                f"{m(g_, lambda r: r.restarts_per_job):.2f} |")
    return ("Mean JCT (s) per workload, `--preset sia-artifact` (sia-64: 6x4 T4, 3x8 "
            "2080Ti, 2x8 A100; 60 s rounds, Gavel 360 s; per-application restart times); "
            "ref = the Sia artifact's simulator run here (n/a: not run):\n\n"
            + "\n".join(lines) + "\n\nAgainst the artifact's simulator, per family:\n\n"
            + _family_table(by, reference) + "\n\nOur goodput policy (equal information) "
            "against our sia (means over workloads; philly 1-4 were used for tuning):\n\n"
            + "\n".join(test) + "\n" + _ablation_table(by))


def _family_table(by: dict[tuple[str, str, float], Row],
                  reference: dict[tuple[str, str], float]) -> str:
    """Our sia and gavel against the artifact's per family: the ratio of the means and the
    range of the per-workload ratios (workloads with both runs only)."""
    fams = ["| policy | workloads | ref mean JCT | our mean JCT | ratio of the means | "
            "ratios per workload |", "|---" * 6 + "|"]
    for pol in ("sia", "gavel"):
        for name, ws in (("philly 1-8", WORKLOADS[:8]), ("saturn 1-10", WORKLOADS[8:])):
            pairs = [(reference[(pol, w)], by[(w, pol, 1.0)].mean_jct_s) for w in ws
                     if (pol, w) in reference and (w, pol, 1.0) in by]
            if not pairs:
                continue
            ref_m, our_m = (float(np.mean(x)) for x in zip(*pairs))
            ratios = [o / r for r, o in pairs]
            fams.append(f"| {pol} | {name} ({len(pairs)}) | {ref_m:,.0f} | {our_m:,.0f} | "
                        f"{our_m / ref_m:.3f} | {min(ratios):.3f}-{max(ratios):.3f} |")
    return "\n".join(fams)


def _ablation_table(by: dict[tuple[str, str, float], Row]) -> str:
    """Each ablation's mean JCT over the tuning workloads against our goodput's there."""
    base = [by.get((w, "goodput", 1.0)) for w in TUNE]
    if not all(base):
        return ""
    ref = float(np.mean([r.mean_jct_s for r in base if r]))
    lines = ["| variant (philly 1-4, load 1.0) | mean JCT | / goodput |", "|---|---|---|",
             f"| goodput (the defaults) | {ref:,.0f} | 1.000 |"]
    for label, _ in ABLATIONS:
        got = [by.get((w, label, 1.0)) for w in TUNE]
        if all(got):
            m = float(np.mean([r.mean_jct_s for r in got if r]))
            lines.append(f"| {label} | {m:,.0f} | {m / ref:.3f} |")
    return "\nAblations of our goodput policy (sections it reads):\n\n" + "\n".join(lines) + "\n"
