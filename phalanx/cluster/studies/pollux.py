"""The ``pollux`` study behind ``reports/cluster/``: (1) under ``--preset pollux-artifact``
(:mod:`~phalanx.cluster.studies.pollux_preset`): the preset's Tiresias, every non-elastic
policy and the goodput policy beside the Pollux artifact's published numbers; (2) under our
default conditions (event engine, 40-min slots, interference): mean JCT on the 8 Pollux
workloads (64 GPUs, 16 servers x 4) for FIFO, SJF, LAS and Tiresias with pack / spread /
load-adaptive / topology-aware placement.

    phalanx simulate --study pollux --out reports/cluster
"""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np

from phalanx.cluster.core.report import Summary
from phalanx.cluster.sim.run import SimulateOptions, load_inputs, simulate
from phalanx.cluster.studies.pollux_preset import preset_study

POLLUX_ORDERINGS = ("fifo", "sjf", "las", "tiresias")
POLLUX_PLACEMENTS = ("pack", "spread", "load-adaptive", "topology")


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


def pollux_studies(base: SimulateOptions, out: Path) -> None:
    """Both Pollux tables: under the artifact's preset, and under our conditions."""
    preset_study(base, out)
    pollux_study(base, out)
