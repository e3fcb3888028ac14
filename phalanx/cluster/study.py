"""Studies behind ``reports/cluster/``:

* ``pollux`` — mean JCT on the 8 Pollux workloads (64 GPUs, 16 servers x 4) for FIFO, SJF,
  LAS and Tiresias with pack / spread / load-adaptive / topology-aware placement.
* ``load`` — the Philly trace at three load levels (arrivals compressed by ``load_scale``)
  on a 512-GPU cluster: when does load-adaptive placement beat always-pack and
  always-spread?

    phalanx simulate --study pollux --out reports/cluster
    phalanx simulate --study load --out reports/cluster
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from phalanx.cluster.report import Summary
from phalanx.cluster.run import SimulateOptions, load_inputs, simulate
from phalanx.errors import ConfigError

POLLUX_ORDERINGS = ("fifo", "sjf", "las", "tiresias")
POLLUX_PLACEMENTS = ("pack", "spread", "load-adaptive", "topology")
LOAD_PLACEMENTS = ("pack", "spread", "load-adaptive")
LOAD_CLUSTER = "uniform:2,2,16,8,2"      # 512 GPUs: 2 zones x 2 racks x 16 servers x 8
LOAD_JOBS = 20000                        # the first 20,000 Philly jobs (~4 weeks)
LOAD_TARGETS = (("low", 0.35), ("medium", 0.7), ("high", 1.0))


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pollux_study(base: SimulateOptions, out: Path) -> list[Summary]:
    rows: list[Summary] = []
    for w in range(1, 9):
        opts = replace(base, trace=f"pollux:{w}", cluster="pollux-64", progress=False)
        inputs = load_inputs(opts)
        for o in POLLUX_ORDERINGS:
            for p in POLLUX_PLACEMENTS:
                s, _ = simulate(replace(opts, ordering=o, placement=p), inputs)
                rows.append(s)
        print(f"workload {w}: done", flush=True)
    with (out / "pollux.csv").open("w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["workload", "ordering", "placement", "mean_jct_h", "p99_jct_h",
                     "mean_queue_h", "makespan_h", "utilisation", "preemptions"])
        for s in rows:
            wr.writerow([s.trace, s.ordering, s.placement, f"{s.mean_jct_s / 3600:.4f}",
                         f"{s.p99_jct_s / 3600:.3f}", f"{s.mean_queue_delay_s / 3600:.4f}",
                         f"{s.makespan_s / 3600:.2f}", f"{s.utilisation_mean:.3f}",
                         s.preemptions])
    table = np.array([[np.mean([s.mean_jct_s / 3600 for s in rows
                                if s.ordering == o and s.placement == p])
                       for p in POLLUX_PLACEMENTS] for o in POLLUX_ORDERINGS])
    lines = ["| ordering \\ placement | " + " | ".join(POLLUX_PLACEMENTS) + " |",
             "|---|" + "---|" * len(POLLUX_PLACEMENTS)]
    for o, row in zip(POLLUX_ORDERINGS, table):
        lines.append(f"| {o} | " + " | ".join(f"{v:.3f}" for v in row) + " |")
    per_w = ["| workload | " + " | ".join(POLLUX_ORDERINGS) + " |",
             "|---|" + "---|" * len(POLLUX_ORDERINGS)]
    topo = {(s.trace, s.ordering): s.mean_jct_s / 3600 for s in rows
            if s.placement == "topology"}
    for w in range(1, 9):
        per_w.append(f"| {w} | " + " | ".join(f"{topo[(f'pollux:{w}', o)]:.3f}"
                                               for o in POLLUX_ORDERINGS) + " |")
    (out / "pollux_table.md").write_text("\n".join(lines) + "\n\nPer workload, topology-aware "
                                         "placement (mean JCT, hours):\n\n"
                                         + "\n".join(per_w) + "\n")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    x = np.arange(len(POLLUX_ORDERINGS))
    for i, p in enumerate(POLLUX_PLACEMENTS):
        ax.bar(x + (i - 1.5) * 0.2, table[:, i], 0.2, label=p)
    ax.set_xticks(x, POLLUX_ORDERINGS)
    ax.set_xlabel("ordering policy")
    ax.set_ylabel("mean JCT (hours, mean of 8 workloads)")
    ax.set_title("Pollux workloads, 64 GPUs (16 x 4)")
    ax.legend(title="placement")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "pollux_jct.png", dpi=110)
    plt.close(fig)
    return rows


def load_study(base: SimulateOptions, out: Path) -> list[tuple[str, float, Summary]]:
    opts = replace(base, trace="philly", cluster=LOAD_CLUSTER, limit=LOAD_JOBS,
                   ordering="fifo", progress=False)
    inputs = load_inputs(opts)
    jobs = inputs.trace.jobs
    span = jobs[-1].submit - jobs[0].submit
    demand = sum(j.gpus * j.duration for j in jobs)
    cap = inputs.topology.num_devices
    rows: list[tuple[str, float, Summary]] = []
    for label, target in LOAD_TARGETS:
        # offered load = GPU-seconds demanded / (capacity x arrival span / scale)
        scale = target * cap * span / demand
        level = replace(opts, load_scale=scale)
        scaled = load_inputs(level)
        for p in LOAD_PLACEMENTS:
            s, _ = simulate(replace(level, placement=p), scaled)
            rows.append((label, target, s))
            print(f"load {label} ({target:.2f}, x{scale:.2f} arrivals) {p}: mean JCT "
                  f"{s.mean_jct_s / 3600:.2f} h, wall {s.wall_s:.1f} s", flush=True)
    (out / "load.json").write_text(json.dumps(
        [{"level": lb, "offered_load": t, **asdict(s)} for lb, t, s in rows], indent=2) + "\n")
    lines = [("| load (offered) | placement | mean JCT h | median JCT h | p99 JCT h "
              "| mean queue h | utilisation | fragmentation | blocked by fragmentation |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for lb, t, s in rows:
        lines.append(f"| {lb} ({t:.2f}) | {s.placement} | {s.mean_jct_s / 3600:.3f} | "
                     f"{s.median_jct_s / 3600:.3f} | {s.p99_jct_s / 3600:.1f} | "
                     f"{s.mean_queue_delay_s / 3600:.3f} | {s.utilisation_mean:.3f} | "
                     f"{s.fragmentation_mean:.3f} | {s.fragmentation_blocked} |")
    (out / "load_table.md").write_text("\n".join(lines) + "\n")
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    labels = [f"{lb}\n({t:.2f})" for lb, t in LOAD_TARGETS]
    x = np.arange(len(LOAD_TARGETS))
    for i, p in enumerate(LOAD_PLACEMENTS):
        jct = [s.mean_jct_s / 3600 for _, _, s in rows if s.placement == p]
        q = [s.mean_queue_delay_s / 3600 for _, _, s in rows if s.placement == p]
        axes[0].bar(x + (i - 1) * 0.27, jct, 0.27, label=p)
        axes[1].bar(x + (i - 1) * 0.27, q, 0.27, label=p)
    for ax, yl in zip(axes, ("mean JCT (hours)", "mean queueing delay (hours)")):
        ax.set_xticks(x, labels)
        ax.set_xlabel("offered load")
        ax.set_ylabel(yl)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(title="placement")
    fig.suptitle(f"Philly, first {LOAD_JOBS} jobs, {cap} GPUs, FIFO")
    fig.tight_layout()
    fig.savefig(out / "load_jct.png", dpi=110)
    plt.close(fig)
    return rows


def run_study(name: str, base: SimulateOptions, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if name == "pollux":
        pollux_study(base, out)
    elif name == "load":
        load_study(base, out)
    else:
        raise ConfigError(f"--study {name}: unknown (pollux, load)")
    print(f"wrote {out}/")
