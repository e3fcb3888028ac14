"""The live interference experiment (issue 49): one job list of real ``phalanx train``
jobs, every class of ``phalanx interference profile`` among them, scheduled on this
machine's slots with ``--pin-cores`` under ``--placement pack``, ``spread`` and
``interference`` (weighing the profile's pair table, refined by what the schedule itself
measures), each placement ``--repeats`` times, interleaved so that a drift of the machine
falls on every placement alike.

    .venv/bin/python tools/interference_live.py \
        --table reports/cluster/interference/interference.json \
        --out reports/cluster/interference/live

The cluster is ``uniform:1,1,1,4,2``: one server of 4 slots on 2 PCIe switches, each switch
pinned to one of the 2 cores, so two jobs on one switch time-share a core. Each job's
steps are set from its class's solo rate in the table so that it would take
``--job-seconds`` alone; arrivals come every ``--gap`` seconds (a seeded shuffle of the
classes). Writes ``live.csv`` (one row per schedule: placement, repeat, mean JCT,
makespan) and ``live.md`` (mean JCT per placement with a 95% t-interval over the repeats,
and the paired ratios with a paired t-test). Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from phalanx.cluster.model.interference import load_table  # noqa: E402
from phalanx.cluster.studies.interference import CLASSES  # noqa: E402
from phalanx.cluster.studies.interference_sim import mean_interval  # noqa: E402
from phalanx.cluster.studies.provenance import commit  # noqa: E402

PLACEMENTS = ("pack", "spread", "interference")
# the profile's click model reads 20,000 samples (its rate is all it measures): a job of
# ~7,000 steps overfits them and ends worse than it started, an error that restarts it
# (seen: test loss 0.70 -> 2.18). 400,000 samples run at the same rate (44k/s) and learn.
LONGER_DATA = {"ctr": {"train_limit": 400000}}
CLUSTER = "uniform:1,1,1,4,2"


def job_config(name: str, steps: int) -> dict:
    """A class's training settings (its profile flags) for a job of ``steps`` steps."""
    c = CLASSES.get(name)
    cfg: dict = {"model": c.model, "strategy": c.strategy, "max_steps": steps,
                 "epochs": 1000000, "eval_every": 1000000000, "test_limit": 200,
                 "tensorboard": False, "threads": 1}
    if c.strategy != "single":
        cfg["worker_threads"] = 1
    flags = list(c.flags)
    while flags:
        key = flags.pop(0)[2:].replace("-", "_")
        value = flags.pop(0)
        cfg[key] = int(value) if value.isdigit() else value
    cfg.update(LONGER_DATA.get(c.model, {}))
    return cfg


def job_list(table: dict, n: int, job_s: float, gap_s: float, seed: int) -> list[dict]:
    classes = list(CLASSES.names())
    order = (classes * math.ceil(n / len(classes)))[:n]
    random.Random(seed).shuffle(order)
    jobs = []
    for i, name in enumerate(order):
        c = CLASSES.get(name)
        cfg = job_config(name, 1)
        batch = int(cfg.get("batch_size", 64))
        solo = float(table["classes"][name]["solo"])      # samples/s, all ranks
        cfg["max_steps"] = max(50, round(job_s * solo / (batch * c.workers)))
        jobs.append({"name": f"j{i:02d}-{name}", "arrival": round(i * gap_s, 2),
                     "gpus": c.workers, "config": cfg})
    return jobs


def run_one(jobs_file: Path, placement: str, table: Path, out: Path) -> dict:
    cmd = [sys.executable, "-m", "phalanx", "schedule", "--jobs", str(jobs_file),
           "--cluster", CLUSTER, "--pin-cores", "--policy", "fifo", "--placement", placement,
           "--out", str(out)]
    if placement == "interference":
        cmd += ["--interference-pairs", str(table)]
    t = time.monotonic()
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"interference_live: {placement} failed ({r.returncode}):\n"
                         f"{r.stdout[-2000:]}{r.stderr[-2000:]}")
    s = json.loads((out / "summary.json").read_text())
    return {"mean_jct_s": s["mean_jct_s"], "makespan_s": s.get("makespan_s", math.nan),
            "finished": s["finished"], "wall_s": time.monotonic() - t}


def t_interval(xs: list[float]) -> str:
    m, h = mean_interval(xs)
    return f"{m:.1f}" if math.isnan(h) else f"{m:.1f} ± {h:.1f}"


def report(rows: list[dict], out: Path, header: str) -> None:
    from scipy import stats

    by = {p: {r["repeat"]: r for r in rows if r["placement"] == p} for p in PLACEMENTS}
    reps = sorted(set.intersection(*(set(v) for v in by.values())))
    lines = [header, "", "| placement | mean JCT (s), mean ± 95% t-interval | each repeat |",
             "|---|---|---|"]
    for p in PLACEMENTS:
        xs = [by[p][k]["mean_jct_s"] for k in reps]
        lines.append(f"| {p} | {t_interval(xs)} | "
                     + ", ".join(f"{x:.1f}" for x in xs) + " |")
    lines += ["", "| comparison | ratio per repeat | mean ratio | paired t-test p |",
              "|---|---|---|---|"]
    for a, b in (("interference", "pack"), ("interference", "spread"), ("spread", "pack")):
        xa = [by[a][k]["mean_jct_s"] for k in reps]
        xb = [by[b][k]["mean_jct_s"] for k in reps]
        ratios = [x / y for x, y in zip(xa, xb)]
        p = stats.ttest_rel(xa, xb).pvalue if len(reps) >= 2 else math.nan
        lines.append(f"| {a} / {b} | " + ", ".join(f"{r:.3f}" for r in ratios)
                     + f" | {statistics.fmean(ratios):.3f} | {p:.3f} |")
    (out / "live.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", type=Path, required=True, help="interference.json (profile)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=10)
    ap.add_argument("--job-seconds", type=float, default=10.0)
    ap.add_argument("--gap", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if not (a.jobs >= 2 and a.job_seconds > 0 and a.gap >= 0 and a.repeats >= 1):
        raise SystemExit("interference_live: --jobs >= 2, --job-seconds > 0, --gap >= 0, "
                         "--repeats >= 1")
    table = json.loads(a.table.read_text())
    load_table(a.table)       # checked as the scheduler will read it
    a.out.mkdir(parents=True, exist_ok=True)
    jobs = job_list(table, a.jobs, a.job_seconds, a.gap, a.seed)
    jobs_file = a.out / "jobs.yaml"     # JSON is YAML: the job list reads it as such
    jobs_file.write_text(json.dumps({"jobs": jobs}, indent=1) + "\n")
    path = a.out / "live.csv"
    rows = []
    if path.exists():
        with path.open() as f:
            rows = [{**r, "repeat": int(r["repeat"]), "mean_jct_s": float(r["mean_jct_s"])}
                    for r in csv.DictReader(f)]
    made = commit()
    for k in range(a.repeats):
        for p in PLACEMENTS:
            if any(r["placement"] == p and r["repeat"] == k for r in rows):
                continue
            res = run_one(jobs_file, p, a.table.resolve(), a.out / f"{p}-{k}")
            if res["finished"] != len(jobs):
                raise SystemExit(f"interference_live: {p} repeat {k}: {res['finished']} of "
                                 f"{len(jobs)} jobs finished (see {a.out}/{p}-{k}/logs)")
            rows.append({"placement": p, "repeat": k, **res, "commit": made})
            print(f"repeat {k} {p}: mean JCT {res['mean_jct_s']:.1f} s "
                  f"({res['finished']} finished, {res['wall_s']:.0f} s)", flush=True)
            with path.open("w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
    report(rows, a.out, f"{a.jobs} jobs (every class of the profile), `{CLUSTER}` with "
           f"`--pin-cores`, fifo, each job {a.job_seconds:g} s alone, arrivals every "
           f"{a.gap:g} s, {a.repeats} repeats interleaved, commit {made}:")


if __name__ == "__main__":
    main()
