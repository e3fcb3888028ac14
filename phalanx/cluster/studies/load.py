"""The load study behind ``reports/cluster/`` (``phalanx simulate --study load``): WHEN does
load-adaptive placement beat always-pack and always-spread?

Grid: two job mixes x two server layouts x three offered loads x interference weights (a
multiplier on the assumed 0.3 / 0.1 neighbour weights, 0 = no interference) x placements x
seeds, FIFO with backfilling on 256 GPUs (1 zone x 2 racks x 16 servers x 8 GPUs) whose
servers have either 2 PCIe switches of 4 GPUs (``2sw``) or one PCIe domain of 8 (``1sw``:
a neighbour anywhere on the server shares the job's switch).

* ``philly`` — the first 3,000 Philly jobs as they are (94% 1-GPU jobs by count, 85% of
  the GPU-time in gangs of 2-16); each job gets a model profile drawn with the seed.
* ``1gpu-sensitive`` — the same arrivals and durations, every job 1 GPU and one of the
  models Gavel measured as most interference-sensitive (sensitivity >= 0.4): the mix where
  spreading has most to gain and packing least to protect.

Offered load = GPU-seconds demanded / (capacity x arrival span); arrivals are compressed
to reach 0.35, 0.70, 1.00. Runs go to a process pool (one run per task).
"""

from __future__ import annotations

import functools
import json
import os
import random
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from phalanx.cluster.core.jobs import JobSpec
from phalanx.cluster.policies import LoadAdaptive, Pack, Spread
from phalanx.cluster.policies.placement import PlacementPolicy, SpreadKeepEmpty
from phalanx.cluster.sim.run import (
    Inputs,
    SimulateOptions,
    load_inputs,
    scaled_interference,
    simulate,
)

CLUSTERS = {"2sw": "uniform:1,2,16,8,2", "1sw": "uniform:1,2,16,8,1"}   # 256 GPUs each
JOBS = 3000                              # first 3,000 Philly jobs (22 days of arrivals)
LOADS = (("low", 0.35), ("medium", 0.7), ("high", 1.0))
SCALES = (0.0, 1.0, 3.0, 8.0)            # x (0.3 same switch, 0.1 same server)
SEEDS = {"philly": (0, 1, 2), "1gpu-sensitive": (0, 1)}
MIXES = ("philly", "1gpu-sensitive")
THRESHOLDS = (0.2, 0.35, 0.5, 0.65, 0.8)  # threshold sweep (mix philly, servers 2sw)
SWEEP_SCALES = (1.0, 3.0)
# the sweep's only winning cell (low load, x1, t=0.2) picked the best of 5 thresholds after
# the fact: re-check it on fresh seeds and neighbouring interference weights
HOLDOUT_SEEDS = (3, 4, 5)
HOLDOUT_SCALES = (0.5, 1.0, 2.0)
HOLDOUT_THRESHOLD = 0.2
SENSITIVE = 0.4                          # Gavel co-location sensitivity threshold of the mix
PLACEMENTS = ("pack", "spread", "spread-keep-empty", "load-adaptive", "load-adaptive-demand")
STATIC = ("pack", "spread", "spread-keep-empty")
ADAPTIVE = ("load-adaptive", "load-adaptive-demand")
# ablation of the ingredients (signal, idle spread, hysteresis) on the real mix, x1, seed 0:
# the columns not in PLACEMENTS are extra runs
ABLATION = ("load-adaptive", "la: util, keep-empty", "la: demand, spread",
            "load-adaptive-demand", "la: demand, keep-empty", "load-adaptive-demand-keep-empty")


def placement_for(name: str, threshold: float = 0.5) -> PlacementPolicy:
    """A fresh placement object for a study label (load-adaptive keeps a mode per run)."""
    h = min(0.2, threshold)
    table = {
        "pack": Pack, "spread": Spread, "spread-keep-empty": SpreadKeepEmpty,
        "load-adaptive": lambda: LoadAdaptive(threshold),
        "load-adaptive-demand": lambda: LoadAdaptive(threshold, Spread(), Pack(), "demand", h),
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
    """One run of the load study's grid."""

    mix: str
    cluster: str
    level: str
    target: float
    scale: float
    placement: str
    seed: int
    threshold: float = 0.5


@dataclass(frozen=True)
class Row:
    """One run's result in ``load.json``."""

    mix: str
    cluster: str
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
    threshold: float = 0.5

    def task(self) -> Task:
        return Task(self.mix, self.cluster, self.level, self.offered_load,
                    self.interference_scale, self.placement, self.seed, self.threshold)


def sensitive_mix(jobs: tuple[JobSpec, ...], inputs: Inputs, seed: int) -> tuple[JobSpec, ...]:
    models = sorted(m for m, p in inputs.perf.profiles.items() if p.interference >= SENSITIVE)
    rng = random.Random(seed)
    return tuple(replace(j, gpus=1, model=rng.choice(models)) for j in jobs)


_CACHE: dict[tuple, tuple[SimulateOptions, Inputs, tuple[JobSpec, ...]]] = {}


def _level(base: SimulateOptions, mix: str, cluster: str, target: float, scale: float,
           seed: int):
    key = (mix, cluster, target, scale, seed)
    if key not in _CACHE:
        opts = replace(base, trace="philly", cluster=CLUSTERS[cluster], limit=JOBS, ordering="fifo",
                       seed=seed, perf=scaled_interference(scale, base.perf.interference),
                       progress=False)
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
    opts, inputs, jobs = _level(base, task.mix, task.cluster, task.target, task.scale,
                                task.seed)
    s, _ = simulate(opts, inputs, jobs, placement_for(task.placement, task.threshold))
    return Row(task.mix, task.cluster, task.level, task.target, task.scale, task.placement,
               task.seed,
               s.mean_jct_s / 3600, s.median_jct_s / 3600, s.p99_jct_s / 3600,
               s.mean_queue_delay_s / 3600, s.utilisation_mean, s.fragmentation_mean,
               s.wall_s, task.threshold)


def _tasks() -> list[Task]:
    tasks = [Task(m, c, lb, t, sc, p, sd) for m in MIXES for c in CLUSTERS for lb, t in LOADS
             for sc in SCALES for sd in SEEDS[m] for p in PLACEMENTS
             if sc > 0 or m == "philly"]   # a 1-GPU mix without interference: all equal
    tasks += [Task("philly", "2sw", lb, t, 1.0, p, 0) for lb, t in LOADS for p in ABLATION
              if p not in PLACEMENTS]
    # threshold sweep of the adaptive policies (0.5 is in the main grid)
    tasks += [Task("philly", "2sw", lb, t, sc, p, sd, th) for lb, t in LOADS
              for sc in SWEEP_SCALES for th in THRESHOLDS if th != 0.5 for p in ADAPTIVE
              for sd in SEEDS["philly"]]
    tasks += [Task("philly", "2sw", "low", 0.35, sc, p, sd,
                   HOLDOUT_THRESHOLD if p in ADAPTIVE else 0.5)
              for sc in HOLDOUT_SCALES for p in STATIC + ADAPTIVE for sd in HOLDOUT_SEEDS]
    # longest first (high load, real mix) so the pool does not end on one straggler
    return sorted(tasks, key=lambda k: (k.mix != "philly", -k.target))


def _mean(rows: list[Row], **match) -> float:
    """Mean JCT of the rows whose fields equal ``match`` (a tuple value: is one of)."""
    vals = [r.mean_jct_h for r in rows
            if all(getattr(r, k) in v if isinstance(v, tuple) else getattr(r, k) == v
                   for k, v in match.items())]
    return float(np.mean(vals)) if vals else float("nan")


def _tables(rows: list[Row]) -> tuple[str, list[dict]]:
    """Markdown tables (mean JCT averaged over seeds) and one verdict entry per setting and
    adaptive policy: how far it is from the best static policy, on how many seeds it won."""
    out, verdicts = [], []
    for mix, cl in [(m, c) for m in MIXES for c in CLUSTERS]:
        seeds = SEEDS[mix]
        out.append(f"\n### Mix `{mix}`, servers `{cl}` — mean JCT (hours, mean of seeds "
                   f"{list(seeds)})\n")
        out.append("| load | interference x | " + " | ".join(PLACEMENTS)
                   + " | best static | each adaptive vs best static (seeds won) |")
        out.append("|---|---|" + "---|" * (len(PLACEMENTS) + 2))
        for lb, t in LOADS:
            for sc in SCALES:
                if sc == 0 and mix != "philly":
                    continue
                # the main grid's seeds only (the hold-out check adds other seeds)
                cell = functools.partial(_mean, rows, mix=mix, cluster=cl, level=lb,
                                         interference_scale=sc, threshold=0.5)
                m = {p: cell(placement=p, seed=seeds) for p in PLACEMENTS}
                best = min(STATIC, key=lambda p: m[p])
                cmp = []
                for p in ADAPTIVE:
                    gain = (m[p] - m[best]) / m[best]
                    wins = sum(1 for sd in seeds
                               if cell(placement=p, seed=sd)
                               < min(cell(placement=q, seed=sd) for q in STATIC))
                    verdicts.append({"mix": mix, "cluster": cl, "level": lb,
                                     "offered_load": t, "scale": sc, "adaptive": p,
                                     "adaptive_h": m[p], "best_static": best,
                                     "best_static_h": m[best], "vs_best_static": gain,
                                     "seeds_won": wins, "seeds": len(seeds)})
                    cmp.append(f"{gain:+.1%} ({wins}/{len(seeds)})")
                cells = " | ".join(f"**{m[p]:.2f}**" if p == min(m, key=m.get)
                                   else f"{m[p]:.2f}" for p in PLACEMENTS)
                out.append(f"| {lb} ({t:.2f}) | {sc:g} | {cells} | {best} | "
                           + " / ".join(cmp) + " |")
    out.append("\n### Ablation of the load-adaptive ingredients (mix `philly`, servers `2sw`, "
               "interference x1, seed 0)\n")
    out.append("| load | " + " | ".join(ABLATION) + " | pack |")
    out.append("|---|" + "---|" * (len(ABLATION) + 1))
    for lb, _ in LOADS:
        def one(p: str, lb: str = lb) -> float:
            return _mean(rows, mix="philly", cluster="2sw", level=lb, interference_scale=1.0,
                         placement=p, seed=0)
        out.append(f"| {lb} | " + " | ".join(f"{one(p):.2f}" for p in ABLATION)
                   + f" | {one('pack'):.2f} |")
    return "\n".join(out) + "\n", verdicts


def _plot(rows: list[Row], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(m, c) for m in MIXES for c in CLUSTERS]
    fig, axes = plt.subplots(len(panels), len(LOADS), figsize=(13, 3.3 * len(panels)),
                             sharex=True)
    x = np.arange(len(SCALES))
    for i, (mix, cl) in enumerate(panels):
        for k, (lb, t) in enumerate(LOADS):
            ax = axes[i][k]
            for p, style in zip(PLACEMENTS, ("-o", "-s", "--s", ":^", "-^")):
                ratio = [_mean(rows, mix=mix, cluster=cl, level=lb, interference_scale=sc,
                               placement=p, threshold=0.5, seed=SEEDS[mix])
                         / _mean(rows, mix=mix, cluster=cl, level=lb, interference_scale=sc,
                                 placement="pack", seed=SEEDS[mix]) for sc in SCALES]
                ax.plot(x, ratio, style, label=p)
            ax.axhline(1.0, color="grey", linewidth=0.6)
            ax.set_xticks(x, [f"{s:g}" for s in SCALES])
            ax.set_title(f"{mix}, {cl}, {lb} load ({t:.2f})", fontsize=10)
            if i == len(panels) - 1:
                ax.set_xlabel("interference multiplier (x 0.3 switch, x 0.1 server)")
            ax.set_ylabel("mean JCT / pack's")
            ax.grid(alpha=0.3)
    axes[0][0].legend(title="placement", fontsize=8)
    fig.suptitle(f"FIFO, first {JOBS} Philly arrivals, 256 GPUs; below 1 = better than "
                 f"always-pack (mean over seeds)")
    fig.tight_layout()
    fig.savefig(out / "load_jct.png", dpi=90)
    plt.close(fig)


def _sweep(rows: list[Row]) -> tuple[str, list[dict]]:
    """Adaptive policies at every threshold against the best static policy (mix philly,
    servers 2sw): is there a threshold at which they win?"""
    out = ["\n### Threshold sweep (mix `philly`, servers `2sw`): mean JCT (hours), "
           f"seeds {list(SEEDS['philly'])}\n",
           "| load | interference x | adaptive | " + " | ".join(f"t={t:g}" for t in THRESHOLDS)
           + " | best static | best threshold vs best static (seeds won) |",
           "|---|---|---|" + "---|" * (len(THRESHOLDS) + 2)]
    verdicts = []
    seeds = SEEDS["philly"]
    for lb, t in LOADS:
        for sc in SWEEP_SCALES:
            cell = functools.partial(_mean, rows, mix="philly", cluster="2sw", level=lb,
                                     interference_scale=sc)
            static = {p: cell(placement=p, threshold=0.5, seed=seeds) for p in STATIC}
            best = min(static, key=static.get)
            for p in ADAPTIVE:
                vals = {th: cell(placement=p, threshold=th, seed=seeds) for th in THRESHOLDS}
                th = min(vals, key=vals.get)
                gain = (vals[th] - static[best]) / static[best]
                wins = sum(1 for sd in seeds
                           if cell(placement=p, threshold=th, seed=sd)
                           < min(cell(placement=q, threshold=0.5, seed=sd) for q in STATIC))
                verdicts.append({"level": lb, "scale": sc, "adaptive": p, "best_threshold": th,
                                 "adaptive_h": vals[th], "best_static": best,
                                 "best_static_h": static[best], "vs_best_static": gain,
                                 "seeds_won": wins, "seeds": len(seeds)})
                out.append(f"| {lb} ({t:.2f}) | {sc:g} | {p} | "
                           + " | ".join(f"{vals[x]:.2f}" for x in THRESHOLDS)
                           + f" | {best} {static[best]:.2f} | t={th:g}: {gain:+.1%} "
                             f"({wins}/{len(seeds)}) |")
    out += [f"\n### Hold-out check (mix `philly`, servers `2sw`, low load, adaptive at "
            f"t={HOLDOUT_THRESHOLD:g}, fresh seeds {list(HOLDOUT_SEEDS)}): mean JCT (hours)\n",
            "| interference x | " + " | ".join(STATIC + ADAPTIVE)
            + " | each adaptive vs best static (seeds won) |",
            "|---|" + "---|" * (len(STATIC) + len(ADAPTIVE) + 1)]
    for sc in HOLDOUT_SCALES:
        def one(p: str, seed: int | None = None, sc: float = sc) -> float:
            """Mean JCT of ``p`` on one hold-out seed, or the mean over all of them."""
            if seed is None:
                return float(np.mean([one(p, sd) for sd in HOLDOUT_SEEDS]))
            return _mean(rows, mix="philly", cluster="2sw", level="low", interference_scale=sc,
                         placement=p, seed=seed,
                         threshold=HOLDOUT_THRESHOLD if p in ADAPTIVE else 0.5)
        best = min(STATIC, key=one)
        cmp = []
        for p in ADAPTIVE:
            gain = (one(p) - one(best)) / one(best)
            wins = sum(1 for sd in HOLDOUT_SEEDS
                       if one(p, sd) < min(one(q, sd) for q in STATIC))
            verdicts.append({"holdout": True, "level": "low", "scale": sc, "adaptive": p,
                             "threshold": HOLDOUT_THRESHOLD, "adaptive_h": one(p),
                             "best_static": best, "best_static_h": one(best),
                             "vs_best_static": gain, "seeds_won": wins,
                             "seeds": len(HOLDOUT_SEEDS)})
            cmp.append(f"{gain:+.1%} ({wins}/{len(HOLDOUT_SEEDS)})")
        out.append(f"| {sc:g} | " + " | ".join(f"{one(p):.2f}" for p in STATIC + ADAPTIVE)
                   + " | " + " / ".join(cmp) + " |")
    return "\n".join(out) + "\n", verdicts


def _plot_sweep(rows: list[Row], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(SWEEP_SCALES), len(LOADS), figsize=(13, 7), sharex=True)
    for i, sc in enumerate(SWEEP_SCALES):
        for k, (lb, t) in enumerate(LOADS):
            ax = axes[i][k]
            cell = functools.partial(_mean, rows, mix="philly", cluster="2sw", level=lb,
                                     interference_scale=sc, seed=SEEDS["philly"])
            pack = cell(placement="pack", threshold=0.5)
            for p, style in zip(ADAPTIVE, (":^", "-^")):
                ax.plot(THRESHOLDS, [cell(placement=p, threshold=th) / pack
                                     for th in THRESHOLDS], style, label=p)
            for p, color in zip(STATIC, ("C0", "C1", "C2")):
                ax.axhline(cell(placement=p, threshold=0.5) / pack, color=color,
                           linestyle="--", linewidth=1, label=f"{p} (static)")
            ax.set_title(f"philly, 2sw, {lb} load ({t:.2f}), interference x{sc:g}",
                         fontsize=10)
            if i == len(SWEEP_SCALES) - 1:
                ax.set_xlabel("load-adaptive threshold (pack at or above)")
            ax.set_ylabel("mean JCT / pack's")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Threshold sweep: FIFO, first {JOBS} Philly arrivals, 256 GPUs, mean of "
                 f"{len(SEEDS['philly'])} seeds; below 1 = better than always-pack")
    fig.tight_layout()
    fig.savefig(out / "load_threshold.png", dpi=90)
    plt.close(fig)


def load_study(base: SimulateOptions, out: Path, workers: int | None = None) -> list[Row]:
    # simulations are deterministic: rows already in load.json are reused (delete the file
    # to recompute everything after a change to the model or the policies)
    old = out / "load.json"
    rows = [Row(**r) for r in json.loads(old.read_text())["rows"]] if old.exists() else []
    have = {r.task() for r in rows}
    rows = [r for r in rows if r.task() in set(_tasks())]
    tasks = [t for t in _tasks() if t not in have]
    workers = workers or min(4, os.cpu_count() or 1)
    with ProcessPoolExecutor(workers) as pool:
        futures = [pool.submit(run_task, base, t) for t in tasks]
        for n, done in enumerate(as_completed(futures), start=1):
            row = done.result()
            rows.append(row)
            print(f"[{n}/{len(tasks)}] {row.mix} {row.cluster} {row.level} "
                  f"x{row.interference_scale:g} "
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
    sweep, sweep_verdicts = _sweep(rows)
    (out / "load.json").write_text(json.dumps({"rows": data["rows"], "verdicts": verdicts,
                                               "threshold_sweep": sweep_verdicts},
                                              indent=1) + "\n")
    (out / "load_table.md").write_text(table + sweep)
    _plot(rows, out)
    _plot_sweep(rows, out)
