"""The load study behind ``reports/cluster/`` (``phalanx simulate --study load``): WHEN does
load-adaptive placement beat always-pack and always-spread?

Grid: two job mixes x three offered loads x interference weights (a multiplier on the
assumed 0.3 / 0.1 neighbour weights, 0 = no interference) x placements x seeds, FIFO with
backfilling on 256 GPUs (1 zone x 2 racks x 16 servers x 8 GPUs, 2 PCIe switches each).

* ``philly`` — the first 3,000 Philly jobs as they are (94% 1-GPU jobs by count, 85% of
  the GPU-time in gangs of 2-16); each job gets a model profile drawn with the seed.
* ``1gpu-sensitive`` — the same arrivals and durations, every job 1 GPU and one of the
  models Gavel measured as most interference-sensitive (sensitivity >= 0.4): the mix where
  spreading has most to gain and packing least to protect.

Offered load = GPU-seconds demanded / (capacity x arrival span); arrivals are compressed
to reach 0.35, 0.70, 1.00. Runs go to a process pool (one run per task).
"""

from __future__ import annotations

import json
import os
import random
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from phalanx.cluster.jobs import JobSpec
from phalanx.cluster.policies import LoadAdaptive, Pack, Spread
from phalanx.cluster.policies.placement import PlacementPolicy, SpreadKeepEmpty
from phalanx.cluster.run import Inputs, SimulateOptions, load_inputs, simulate

CLUSTER = "uniform:1,2,16,8,2"           # 256 GPUs
JOBS = 3000                              # first 3,000 Philly jobs (22 days of arrivals)
LOADS = (("low", 0.35), ("medium", 0.7), ("high", 1.0))
SCALES = (0.0, 1.0, 4.0)                 # x (0.3 same switch, 0.1 same server)
SEEDS = {"philly": (0, 1), "1gpu-sensitive": (0,)}
MIXES = ("philly", "1gpu-sensitive")
SENSITIVE = 0.4                          # Gavel co-location sensitivity threshold of the mix
PLACEMENTS = ("pack", "spread", "spread-keep-empty", "load-adaptive", "load-adaptive-demand")
STATIC = ("pack", "spread", "spread-keep-empty")
ADAPTIVE = ("load-adaptive", "load-adaptive-demand")
# ablation of the ingredients (signal, idle spread, hysteresis) on the real mix, x1, seed 0:
# the columns not in PLACEMENTS are extra runs
ABLATION = ("load-adaptive", "la: util, keep-empty", "la: demand, spread",
            "load-adaptive-demand", "la: demand, keep-empty", "load-adaptive-demand-keep-empty")


def placement_for(name: str) -> PlacementPolicy:
    """A fresh placement object for a study label (load-adaptive keeps a mode per run)."""
    table = {
        "pack": Pack, "spread": Spread, "spread-keep-empty": SpreadKeepEmpty,
        "load-adaptive": lambda: LoadAdaptive(0.5),
        "load-adaptive-demand": lambda: LoadAdaptive(0.5, Spread(), Pack(), "demand", 0.2),
        "load-adaptive-demand-keep-empty": lambda: LoadAdaptive(0.5, SpreadKeepEmpty(), Pack(),
                                                                "demand", 0.2),
        "la: util, keep-empty": lambda: LoadAdaptive(0.5, SpreadKeepEmpty()),
        "la: demand, spread": lambda: LoadAdaptive(0.5, Spread(), Pack(), "demand"),
        "la: demand, keep-empty": lambda: LoadAdaptive(0.5, SpreadKeepEmpty(), Pack(),
                                                       "demand"),
    }
    return table[name]()


@dataclass(frozen=True)
class Task:
    mix: str
    level: str
    target: float
    scale: float
    placement: str
    seed: int


@dataclass(frozen=True)
class Row:
    mix: str
    level: str
    offered_load: float
    interference_scale: float
    placement: str
    seed: int
    mean_jct_h: float
    median_jct_h: float
    p99_jct_h: float
    mean_queue_h: float
    utilisation: float
    fragmentation: float
    wall_s: float


def sensitive_mix(jobs: tuple[JobSpec, ...], inputs: Inputs, seed: int) -> tuple[JobSpec, ...]:
    models = sorted(m for m, p in inputs.perf.profiles.items() if p.interference >= SENSITIVE)
    rng = random.Random(seed)
    return tuple(replace(j, gpus=1, model=rng.choice(models)) for j in jobs)


_CACHE: dict[tuple, tuple[SimulateOptions, Inputs, tuple[JobSpec, ...]]] = {}


def _level(base: SimulateOptions, mix: str, target: float, scale: float, seed: int):
    key = (mix, target, scale, seed)
    if key not in _CACHE:
        opts = replace(base, trace="philly", cluster=CLUSTER, limit=JOBS, ordering="fifo",
                       seed=seed, interference_scale=scale, progress=False)
        inputs = load_inputs(opts)
        jobs = inputs.trace.jobs if mix == "philly" else sensitive_mix(inputs.trace.jobs,
                                                                        inputs, seed)
        span = jobs[-1].submit - jobs[0].submit
        demand = sum(j.gpus * j.duration for j in jobs)
        # offered load = GPU-seconds demanded / (capacity x arrival span / compression)
        k = target * inputs.topology.num_devices * span / demand
        jobs = tuple(replace(j, submit=j.submit / k) for j in jobs)
        _CACHE[key] = (opts, inputs, jobs)
    return _CACHE[key]


def run_task(base: SimulateOptions, task: Task) -> Row:
    opts, inputs, jobs = _level(base, task.mix, task.target, task.scale, task.seed)
    s, _ = simulate(opts, inputs, jobs, placement_for(task.placement))
    return Row(task.mix, task.level, task.target, task.scale, task.placement, task.seed,
               s.mean_jct_s / 3600, s.median_jct_s / 3600, s.p99_jct_s / 3600,
               s.mean_queue_delay_s / 3600, s.utilisation_mean, s.fragmentation_mean,
               s.wall_s)


def _tasks() -> list[Task]:
    tasks = [Task(m, lb, t, sc, p, sd) for m in MIXES for lb, t in LOADS for sc in SCALES
             for sd in SEEDS[m] for p in PLACEMENTS
             if sc > 0 or m == "philly"]   # a 1-GPU mix without interference: all equal
    tasks += [Task("philly", lb, t, 1.0, p, 0) for lb, t in LOADS for p in ABLATION
              if p not in PLACEMENTS]
    # longest first (high load, real mix) so the pool does not end on one straggler
    return sorted(tasks, key=lambda k: (k.mix != "philly", -k.target))


def _mean(rows: list[Row], **match) -> float:
    vals = [r.mean_jct_h for r in rows if all(getattr(r, k) == v for k, v in match.items())]
    return float(np.mean(vals)) if vals else float("nan")


def _tables(rows: list[Row]) -> tuple[str, list[dict]]:
    """Markdown tables (mean JCT averaged over seeds) and one verdict entry per setting."""
    out, verdicts = [], []
    for mix in MIXES:
        out.append(f"\n### Mix `{mix}` — mean JCT (hours, mean of seeds {list(SEEDS[mix])})"
                   f"\n")
        out.append("| load | interference x | " + " | ".join(PLACEMENTS)
                   + " | best static | each adaptive vs best static (seeds won) |")
        out.append("|---|---|" + "---|" * (len(PLACEMENTS) + 2))
        for lb, t in LOADS:
            for sc in SCALES:
                if sc == 0 and mix != "philly":
                    continue
                m = {p: _mean(rows, mix=mix, level=lb, interference_scale=sc, placement=p)
                     for p in PLACEMENTS}
                best = min(STATIC, key=lambda p: m[p])
                cmp = []
                for p in ADAPTIVE:
                    gain = (m[p] - m[best]) / m[best]
                    wins = sum(1 for sd in SEEDS[mix]
                               if _mean(rows, mix=mix, level=lb, interference_scale=sc,
                                        placement=p, seed=sd)
                               < min(_mean(rows, mix=mix, level=lb, interference_scale=sc,
                                           placement=q, seed=sd) for q in STATIC))
                    verdicts.append({"mix": mix, "level": lb, "offered_load": t, "scale": sc,
                                     "adaptive": p, "adaptive_h": m[p], "best_static": best,
                                     "best_static_h": m[best], "vs_best_static": gain,
                                     "seeds_won": wins, "seeds": len(SEEDS[mix])})
                    cmp.append(f"{gain:+.1%} ({wins}/{len(SEEDS[mix])})")
                cells = " | ".join(f"**{m[p]:.2f}**" if p == min(m, key=m.get)
                                   else f"{m[p]:.2f}" for p in PLACEMENTS)
                out.append(f"| {lb} ({t:.2f}) | {sc:g} | {cells} | {best} | "
                           + " / ".join(cmp) + " |")
    out.append("\n### Ablation of load-adaptive-demand (mix `philly`, interference x1, seed 0)"
               "\n")
    out.append("| load | " + " | ".join(ABLATION) + " | pack |")
    out.append("|---|" + "---|" * (len(ABLATION) + 1))
    for lb, _ in LOADS:
        def one(p: str, lb: str = lb) -> float:
            return _mean(rows, mix="philly", level=lb, interference_scale=1.0, placement=p,
                         seed=0)
        out.append(f"| {lb} | " + " | ".join(f"{one(p):.2f}" for p in ABLATION)
                   + f" | {one('pack'):.2f} |")
    return "\n".join(out) + "\n", verdicts


def _plot(rows: list[Row], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(MIXES), len(LOADS), figsize=(13, 7.5), sharex=True)
    x = np.arange(len(SCALES))
    for i, mix in enumerate(MIXES):
        for k, (lb, t) in enumerate(LOADS):
            ax = axes[i][k]
            for p, style in zip(PLACEMENTS, ("-o", "-s", "--s", ":^", "-^")):
                ratio = [_mean(rows, mix=mix, level=lb, interference_scale=sc, placement=p)
                         / _mean(rows, mix=mix, level=lb, interference_scale=sc,
                                 placement="pack") for sc in SCALES]
                ax.plot(x, ratio, style, label=p)
            ax.axhline(1.0, color="grey", linewidth=0.6)
            ax.set_xticks(x, [f"{s:g}" for s in SCALES])
            ax.set_title(f"{mix}, {lb} load ({t:.2f})", fontsize=10)
            ax.set_xlabel("interference multiplier (x 0.3 switch, x 0.1 server)")
            ax.set_ylabel("mean JCT / pack's mean JCT")
            ax.grid(alpha=0.3)
    axes[0][0].legend(title="placement", fontsize=8)
    fig.suptitle(f"FIFO, first {JOBS} Philly arrivals, 256 GPUs; below 1 = better than "
                 f"always-pack (mean over seeds)")
    fig.tight_layout()
    fig.savefig(out / "load_jct.png", dpi=100)
    plt.close(fig)


def load_study(base: SimulateOptions, out: Path, workers: int | None = None) -> list[Row]:
    tasks = _tasks()
    workers = workers or min(4, os.cpu_count() or 1)
    rows: list[Row] = []
    with ProcessPoolExecutor(workers) as pool:
        futures = [pool.submit(run_task, base, t) for t in tasks]
        for n, done in enumerate(as_completed(futures), start=1):
            row = done.result()
            rows.append(row)
            print(f"[{n}/{len(tasks)}] {row.mix} {row.level} x{row.interference_scale:g} "
                  f"seed {row.seed} {row.placement}: mean JCT {row.mean_jct_h:.2f} h "
                  f"({row.wall_s:.0f} s)", flush=True)
    (out / "load.json").write_text(json.dumps({"rows": [asdict(r) for r in rows]}, indent=1)
                                   + "\n")
    render(out)
    return rows


def render(out: Path) -> None:
    """Tables, verdicts and the plot from ``out/load.json`` (re-render without re-running)."""
    data = json.loads((out / "load.json").read_text())
    rows = [Row(**r) for r in data["rows"]]
    table, verdicts = _tables(rows)
    (out / "load.json").write_text(json.dumps({"rows": data["rows"], "verdicts": verdicts},
                                              indent=1) + "\n")
    (out / "load_table.md").write_text(table)
    _plot(rows, out)
