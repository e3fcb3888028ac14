"""``--placement interference`` against ``pack`` and ``spread`` in simulation, every run
priced by the same pair table (``--interference-pairs gavel``: Gavel's co-located pairs,
neighbours weighted 0.3 on a PCIe switch and 0.1 elsewhere on the server, issue 49):

* Sia's Philly workloads 1-4 (``sia:philly:N``: gangs of 4-16 GPUs) on 64 GPUs as 8
  servers of 8 (two PCIe switches each), and as 16 servers of 4, where a gang of 4 or more
  takes whole servers and no placement has a choice;
* the Philly trace with Gavel's job types (Gavel's own simulation set-up: Philly
  arrivals and durations, a model family drawn per job), 1,500 jobs at a tenth of the
  arrival rate on 64 GPUs (16 x 4), seeds 0-4 (the draw of each job's family).

Each under ``las`` and ``fifo`` (the event engine: the interval engine has no
interference). The ratio interference / pack and interference / spread is taken per run
and averaged over the workloads or seeds with a 95% t-interval.

    phalanx simulate --study interference --out reports/cluster
    -> interference/interference_sim.csv, interference/interference_sim.md

Rows already in the CSV are reused (a run is deterministic); delete them to recompute.
"""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from phalanx.cluster.sim.run import SimulateOptions, load_inputs, simulate
from phalanx.cluster.studies.provenance import commit, resolved

PLACEMENTS = ("pack", "spread", "interference")
ORDERINGS = ("las", "fifo")
# (group label, trace, cluster, extra options) per workload run
GROUPS: tuple[tuple[str, tuple[tuple[str, str, dict], ...]], ...] = (
    ("sia philly 1-4, 8 x 8 GPUs", tuple((f"sia:philly:{w}", "uniform:1,1,8,8,2", {})
                                         for w in range(1, 5))),
    ("sia philly 1-4, 16 x 4 GPUs", tuple((f"sia:philly:{w}", "uniform:1,2,8,4,2", {})
                                          for w in range(1, 5))),
    ("philly + Gavel job types, 16 x 4 GPUs, seeds 0-4",
     tuple(("philly", "uniform:1,2,8,4,2", {"limit": 1500, "load_scale": 0.1, "seed": s})
           for s in range(5))),
)
FIELDS = ("group", "trace", "cluster", "seed", "ordering", "placement", "mean_jct_s",
          "p99_jct_s", "finished", "wall_s", "commit", "options")


@dataclass(frozen=True)
class Row:
    group: str
    trace: str
    cluster: str
    seed: int
    ordering: str
    placement: str
    mean_jct_s: float
    p99_jct_s: float
    finished: int
    wall_s: float
    commit: str
    options: str

    @property
    def key(self) -> tuple:
        return (self.group, self.trace, self.cluster, self.seed, self.ordering,
                self.placement)


def _read(path: Path) -> dict[tuple, Row]:
    if not path.exists():
        return {}
    with path.open(newline="") as f:
        rows = [Row(r["group"], r["trace"], r["cluster"], int(r["seed"]), r["ordering"],
                    r["placement"], float(r["mean_jct_s"]), float(r["p99_jct_s"]),
                    int(r["finished"]), float(r["wall_s"]), r["commit"], r["options"])
                for r in csv.DictReader(f)]
    return {r.key: r for r in rows}


def _write(path: Path, rows: dict[tuple, Row]) -> None:
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for r in sorted(rows.values(), key=lambda r: r.key):
            w.writerow([r.group, r.trace, r.cluster, r.seed, r.ordering, r.placement,
                        f"{r.mean_jct_s:.1f}", f"{r.p99_jct_s:.1f}", r.finished,
                        f"{r.wall_s:.2f}", r.commit, r.options])
    tmp.replace(path)


def interference_study(base: SimulateOptions, out: Path) -> list[Row]:
    folder = out / "interference"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "interference_sim.csv"
    done = _read(path)
    made = commit()
    for group, runs in GROUPS:
        for trace, cluster, extra in runs:
            opts = SimulateOptions.from_dict({
                "trace": trace, "cluster": cluster, "data_dir": base.data_dir,
                "progress": False, "perf": {"pairs": "gavel"}, **extra})
            inputs = None
            for ordering in ORDERINGS:
                for placement in PLACEMENTS:
                    key = (group, trace, cluster, opts.seed, ordering, placement)
                    if key in done:
                        continue
                    inputs = inputs or load_inputs(opts)
                    run = opts.merged({"ordering": ordering, "placement": placement})
                    s, res = simulate(run, inputs)
                    jct = sorted(j.end - j.spec.submit for j in res.jobs if j.end >= 0)
                    p99 = jct[min(len(jct) - 1, int(0.99 * len(jct)))] if jct else math.nan
                    done[key] = Row(group, trace, cluster, opts.seed, ordering, placement,
                                    s.mean_jct_s, p99, s.finished, s.wall_s, made,
                                    resolved(run))
                    _write(path, done)
            print(f"interference: {trace} seed {opts.seed} on {cluster}: done", flush=True)
    rows = list(done.values())
    (folder / "interference_sim.md").write_text(table(rows))
    return rows


def mean_interval(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval."""
    from scipy import stats

    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, math.nan
    return m, float(stats.t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs)))


def table(rows: list[Row]) -> str:
    """Per group and ordering: mean JCT of each placement (mean over its runs) and the
    per-run ratios of interference to pack and to spread with 95% intervals."""
    by: dict[tuple, dict[str, Row]] = {}
    for r in rows:
        by.setdefault((r.group, r.ordering, r.trace, r.seed), {})[r.placement] = r
    lines = ["| workloads | ordering | runs | mean JCT pack (h) | spread (h) | interference (h) "
             "| interference / pack | interference / spread |", "|---|---|---|---|---|---|---|---|"]
    for group, _ in GROUPS:
        for ordering in ORDERINGS:
            runs = [v for (g, o, _, _), v in by.items() if g == group and o == ordering
                    and all(p in v for p in PLACEMENTS)]
            if not runs:
                continue
            mean = {p: statistics.fmean(v[p].mean_jct_s for v in runs) / 3600
                    for p in PLACEMENTS}
            ratios = []
            for other in ("pack", "spread"):
                m, h = mean_interval([v["interference"].mean_jct_s / v[other].mean_jct_s
                                  for v in runs])
                ratios.append(f"{m:.3f} ± {h:.3f}" if not math.isnan(h) else f"{m:.3f}")
            lines.append(f"| {group} | {ordering} | {len(runs)} | {mean['pack']:.2f} | "
                         f"{mean['spread']:.2f} | {mean['interference']:.2f} | "
                         + " | ".join(ratios) + " |")
    return ("Mean JCT with every run priced by Gavel's co-located pairs "
            "(`--interference-pairs gavel`); ratios per run, mean ± 95% t-interval half-"
            "width over the runs (below 1: interference-aware placement is faster):\n\n"
            + "\n".join(lines) + "\n")
