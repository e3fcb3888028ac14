"""The Pollux comparison under the artifact's conditions (``--preset pollux-artifact``):
per-workload mean JCT of the preset's Tiresias, our best non-elastic policy, our run of
Pollux's own policy (``--policy pollux``) and the goodput policy on learned profiles
(equal information) and, labelled as ablations, on the measured profiles (oracle), beside
the Pollux artifact's published Tiresias and Pollux figures; and each policy's wall time.

    phalanx simulate --study pollux --out reports/cluster
    -> pollux_preset.csv, pollux_preset.md, pollux_preset.png
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from phalanx.cluster.sim.run import SimulateOptions, apply_preset, load_inputs, simulate

# Published mean JCT (s) of the Pollux artifact (OSDI'21, petuum/adaptdl osdi21-artifact),
# workloads 1..8 at 1.0x load, 64 GPUs
ARTIFACT_TIRESIAS = (2474, 5145, 3876, 3280, 3501, 3470, 5480, 5080)
ARTIFACT_POLLUX = (2089, 3323, 2188, 2721, 2674, 2446, 3616, 2952)

NON_ELASTIC = tuple((o, p) for o in ("fifo", "sjf", "las", "tiresias", "rr")
                    for p in ("count", "pack", "topology"))
# elastic runs: (policy, variant, options). Learned profiles know what Pollux knows (the
# goodput policy of every cluster, goodput_typed.py); oracle runs read every measured
# profile (ablations), srpt also the epochs users declare
ELASTIC_RUNS: tuple[tuple[str, str, dict[str, object]], ...] = (
    ("pollux", "learned", {}),
    ("goodput", "learned/none", {"goodput": {"priority": "none"}}),
    ("goodput", "learned/las", {"goodput": {"priority": "las"}}),
    ("goodput", "oracle/none", {"goodput": {"priority": "none", "profiles": "oracle"}}),
    ("goodput", "oracle/srpt", {"goodput": {"priority": "srpt", "profiles": "oracle"}}),
)


@dataclass(frozen=True)
class Row:
    """One run's result in ``pollux_preset.csv``."""

    workload: int
    policy: str          # ordering or goodput
    variant: str         # placement, or the goodput priority
    mean_jct_s: float
    finished: int
    preemptions: int
    wall_s: float


def _label(policy: str, variant: str) -> str:
    return f"{policy}/{variant}"


def preset_study(base: SimulateOptions, out: Path) -> list[Row]:
    """Every run on the 8 workloads; rows already in ``pollux_preset.csv`` are reused
    (runs are deterministic), so delete it to recompute after a model or policy change."""
    path = out / "pollux_preset.csv"
    done = {(r.workload, r.policy, r.variant): r for r in read_rows(path)} \
        if path.exists() else {}
    runs = ([(o, p, {"ordering": o, "placement": p}) for o, p in NON_ELASTIC]
            + [(o, v, {"ordering": o, **kw}) for o, v, kw in ELASTIC_RUNS])
    rows: list[Row] = []
    for w in range(1, 9):
        given = {"trace": f"pollux:{w}", "data_dir": base.data_dir, "progress": False}
        opts = SimulateOptions.from_dict(apply_preset("pollux-artifact", given))
        inputs = None
        for policy, variant, kw in runs:
            hit = done.get((w, policy, variant))
            if hit is None:
                inputs = inputs or load_inputs(opts)
                s, _ = simulate(opts.merged(kw), inputs)
                hit = Row(w, policy, variant, s.mean_jct_s, s.finished, s.preemptions,
                          s.wall_s)
            rows.append(hit)
        print(f"preset, workload {w}: done", flush=True)
    write_preset_outputs(rows, out)
    return rows


def read_rows(path: Path) -> list[Row]:
    """The rows of a ``pollux_preset.csv`` (to redraw the table and plot)."""
    with path.open(newline="") as f:
        return [Row(int(r["workload"]), r["policy"], r["variant"], float(r["mean_jct_s"]),
                    int(r["finished"]), int(r["preemptions"]), float(r["wall_s"]))
                for r in csv.DictReader(f)]


def _means(rows: list[Row]) -> dict[str, list[float]]:
    by: dict[str, list[float]] = {}
    for r in sorted(rows, key=lambda r: r.workload):
        by.setdefault(_label(r.policy, r.variant), []).append(r.mean_jct_s)
    return by


def write_preset_outputs(rows: list[Row], out: Path) -> None:
    with (out / "pollux_preset.csv").open("w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["workload", "policy", "variant", "mean_jct_s", "finished",
                     "preemptions", "wall_s"])
        for r in rows:
            wr.writerow([r.workload, r.policy, r.variant, f"{r.mean_jct_s:.1f}", r.finished,
                         r.preemptions, f"{r.wall_s:.2f}"])
    by = _means(rows)
    ours_t = by["tiresias/count"]
    non_elastic = {k: v for k, v in by.items() if k.split("/")[0] in
                   ("fifo", "sjf", "las", "tiresias", "rr")}
    best = min(non_elastic, key=lambda k: np.mean(non_elastic[k]))
    pollux, good = by["pollux/learned"], by["goodput/learned/none"]
    cols = [("artifact Tiresias", ARTIFACT_TIRESIAS), ("our Tiresias (preset)", ours_t),
            (f"best non-elastic ({best})", by[best]),
            ("artifact Pollux (published)", ARTIFACT_POLLUX), ("our pollux", pollux),
            ("goodput, learned, none", good), ("goodput, learned, las", by["goodput/learned/las"]),
            ("goodput, oracle, none (oracle ablation)", by["goodput/oracle/none"]),
            ("goodput, oracle, srpt (oracle ablation, uses declared epochs)",
             by["goodput/oracle/srpt"])]
    lines = ["| workload | " + " | ".join(c for c, _ in cols)
             + " | our pollux / artifact | goodput none / our pollux"
             + " | goodput none / artifact Pollux |",
             "|---|" + "---|" * (len(cols) + 3)]
    for i in range(8):
        lines.append(f"| {i + 1} | " + " | ".join(f"{v[i]:,.0f}" for _, v in cols)
                     + f" | {pollux[i] / ARTIFACT_POLLUX[i]:.3f}"
                     + f" | {good[i] / pollux[i]:.3f}"
                     + f" | {good[i] / ARTIFACT_POLLUX[i]:.3f} |")
    mean = {c: float(np.mean(v)) for c, v in cols}
    m_art, m_pol, m_good = (mean["artifact Pollux (published)"], mean["our pollux"],
                            mean["goodput, learned, none"])
    lines.append("| **mean** | " + " | ".join(f"**{mean[c]:,.0f}**" for c, _ in cols)
                 + f" | {m_pol / m_art:.3f} | {m_good / m_pol:.3f} | {m_good / m_art:.3f} |")
    walls = ["| policy | " + " | ".join(f"w{w}" for w in range(1, 9)) + " | median |",
             "|---|" + "---|" * 9]
    for label in ("tiresias/count", "pollux/learned", "goodput/learned/none",
                  "goodput/oracle/none"):
        ws = [r.wall_s for r in sorted(rows, key=lambda r: r.workload)
              if _label(r.policy, r.variant) == label]
        walls.append(f"| {label} | " + " | ".join(f"{w:.1f}" for w in ws)
                     + f" | {float(np.median(ws)):.1f} |")
    grid = ["| ordering \\ placement | count | pack | topology |", "|---|---|---|---|"]
    for o in ("fifo", "sjf", "las", "tiresias", "rr"):
        grid.append(f"| {o} | " + " | ".join(f"{np.mean(by[_label(o, p)]):,.0f}"
                                             for p in ("count", "pack", "topology")) + " |")
    (out / "pollux_preset.md").write_text(
        "Mean JCT (s) per workload, 64 GPUs (16 x 4), `--preset pollux-artifact` (60 s "
        "interval, 30 s restart on every allocation, no interference):\n\n"
        + "\n".join(lines) + "\n\nSimulator wall time per workload (s, this machine):\n\n"
        + "\n".join(walls) + "\n\nNon-elastic policies under the preset, mean of the 8 "
        "workloads (s):\n\n" + "\n".join(grid) + "\n")
    _plot(cols, out / "pollux_preset.png")


def _plot(cols: list[tuple[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = np.array([list(v) + [float(np.mean(v))] for _, v in cols]) / 3600
    x = np.arange(9)
    width = 0.8 / len(cols)
    colours = ["#bbbbbb", "#1f77b4", "#2ca02c", "#ff9f9f", "#d62728", "#ff7f0e", "#9467bd",
               "#8c564b", "#e0e0e0", "#f0f0f0"]
    fig, ax = plt.subplots(figsize=(11, 6))
    for i, (name, _) in enumerate(cols):
        ax.bar(x + (i - (len(cols) - 1) / 2) * width, data[i], width, label=name,
               color=colours[i % len(colours)],
               hatch=("//" if name.startswith("artifact")
                      else ".." if "oracle" in name else None))
    ax.set_xticks(x, [str(i) for i in range(1, 9)] + ["mean"])
    ax.set_xlabel("Pollux workload")
    ax.set_ylabel("mean JCT (hours)")
    ax.set_title("Pollux workloads, 64 GPUs, artifact conditions (// published, "
                 ".. oracle ablation)")
    ax.set_ylim(0, float(data.max()) * 1.1)
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
