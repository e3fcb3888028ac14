"""The report folder of ``phalanx scale report``: CSV of every prediction, Markdown with the
crossover table and the bottleneck at each point, PNG of efficiency and time-to-target
against N, and the published results with their assumptions."""

from __future__ import annotations

import csv
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

from phalanx.metrics import plots
from phalanx.scale.convergence import Convergence
from phalanx.scale.eventsim import AsyncSpec, simulate
from phalanx.scale.network import gbit
from phalanx.scale.published import Check, all_checks
from phalanx.scale.setting import Stragglers
from phalanx.scale.sweep import Row, Shape, crossovers
from phalanx.scale.workload import Workload, describe


def commit() -> str:
    """The checkout's commit (short), ``unknown`` outside one: what a report was made by."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=False, cwd=Path(__file__).parent)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def write_csv(path: Path, rows: Sequence[Row], conv: Convergence) -> None:
    fields = ["strategy", "workers", "step_ms", "compute_ms", "exposed_comm_ms", "comm_ms",
              "server_ms", "bubble_ms", "straggler_ms", "mb_per_worker", "messages_per_worker",
              "bottleneck", "samples_per_s", "efficiency", "staleness_mean", "time_to_target_s",
              "skipped"]
    with path.open("w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=fields)
        out.writeheader()
        for r in rows:
            if r.prediction is None:
                out.writerow({"strategy": r.strategy, "workers": r.workers,
                              "skipped": r.skipped})
                continue
            row = r.prediction.row()
            row["time_to_target_s"] = round(conv.time_to_target(r.prediction), 3)
            row["skipped"] = ""
            out.writerow(row)


def _series(rows: Sequence[Row], value) -> dict[str, tuple[list[float], list[float]]]:
    series: dict[str, tuple[list[float], list[float]]] = {}
    for r in rows:
        if r.prediction is not None:
            xs, ys = series.setdefault(r.strategy, ([], []))
            xs.append(r.workers)
            ys.append(value(r.prediction))
    return series


def async_rows(w: Workload, shape: Shape, ns: Sequence[int] = (64, 512)) -> list[str]:
    rows = []
    nic = gbit(shape.nic_gbit)
    for n in ns:
        for mode, bound in (("bsp", 0), ("asp", 0), ("ssp", 4), ("softsync", 4)):
            r = simulate(AsyncSpec(workers=n, shards=max(1, n // 4), steps=100,
                                   compute_s=w.step_compute_s, push_bytes=w.grad_bytes,
                                   pull_bytes=w.grad_bytes,
                                   worker_bw=nic / shape.gpus_per_server, shard_bw=nic,
                                   latency_s=shape.latency_us * 1e-6, consistency=mode,
                                   bound=bound, stragglers=Stragglers("lognormal:0.3")))
            label = mode if not bound else f"{mode}({bound})"
            rows.append(f"| {n} | {label} | {r.step_s * 1e3:.1f} | {r.staleness_mean:.1f} | "
                        f"{r.staleness_p99} | {r.staleness_max} | {r.push_wait_s * 1e3:.2f} | "
                        f"{r.barrier_wait_s * 1e3:.1f} |")
    return rows


def checks_markdown(checks: dict[str, list[Check]]) -> list[str]:
    lines = ["| result | paper | model | error | holds | source |", "|---|---|---|---|---|---|"]
    for group in checks.values():
        for c in group:
            paper = "" if c.paper is None else f"{c.paper:.4g}"
            err = "" if c.error is None else f"{c.error:+.1%}"
            lines.append(f"| {c.claim} | {paper} | {c.model:.4g} {c.unit} | {err} | "
                         f"{'yes' if c.holds else '**no**'} | {c.source} |")
    lines.append("")
    lines.append("Assumptions:")
    seen: set[str] = set()
    for group in checks.values():
        for c in group:
            for a in c.assumptions:
                if a not in seen:
                    seen.add(a)
                    lines.append(f"- {a}")
    return lines


def write_report(out: Path, w: Workload, rows: Sequence[Row], shape: Shape,
                 conv: Convergence, command: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "predictions.csv", rows, conv)
    plots.line_plot(out / "efficiency.png", _series(rows, lambda p: p.efficiency),
                    xlabel="workers", ylabel="scaling efficiency", logx=True,
                    title=f"{w.name}: efficiency vs N ({shape.nic_gbit:g} Gbit/s NICs)")
    plots.line_plot(out / "time_to_target.png",
                    _series(rows, lambda p: conv.time_to_target(p)), xlabel="workers",
                    ylabel="time to target (s, model)", logx=True, logy=True,
                    title=f"{w.name}: time to target vs N (convergence model)")
    one = Shape(**{**shape.__dict__, "gpus_per_server": 1})
    table = [("cluster", f"{shape.gpus_per_server} GPUs per server")] + crossovers(w, shape)
    table += [("cluster", "1 GPU per server")] + crossovers(w, one)
    checks = all_checks()
    lines = [f"# phalanx scale: {w.name}", "", f"Reproduce: `{command}`", "",
             f"Commit {commit()}. Model: {describe(w)}. {w.notes}", "",
             f"Cluster: uniform, {shape.gpus_per_server} GPUs per server, "
             f"{shape.servers_per_rack} servers per rack, NIC {shape.nic_gbit:g} Gbit/s, "
             f"intra {shape.intra_gbit:g} Gbit/s, {shape.latency_us:g} us per message, "
             f"rack oversubscription {shape.oversubscription:g}.", "",
             "## Crossovers", "", "| question | answer |", "|---|---|"]
    lines += [f"| {q} | {a} |" for q, a in table]
    lines += ["", "## Efficiency and bottleneck at each point", "",
              "| strategy | " + " | ".join(f"N={n}" for n in sorted({r.workers for r in rows}))
              + " |", "|---|" + "---|" * len({r.workers for r in rows})]
    by: dict[str, list[str]] = {}
    for r in rows:
        cell = ("n/a" if r.prediction is None else
                f"{r.prediction.efficiency:.2f} ({r.prediction.bottleneck})")
        by.setdefault(r.strategy, []).append(cell)
    lines += [f"| {s} | " + " | ".join(cells) + " |" for s, cells in by.items()]
    lines += ["", "n/a: not defined there (hogwild shares one machine's memory).", "",
              "![efficiency](efficiency.png)", "", "![time to target](time_to_target.png)", "",
              f"Time to target is a model (labelled so): Pollux's efficiency with "
              f"{conv.noise_ratio:g} x the initial batch {conv.init_batch:g} as the gradient "
              f"noise scale, {conv.base_steps:g} steps at that batch, "
              f"1 + {conv.staleness_slope:g} x mean staleness for the asynchronous family.",
              "", "## Asynchronous family: the event simulation", "",
              "N workers against S = N/4 shards (one NIC each), 100 steps per worker, "
              "lognormal(0.3) stragglers; staleness in applied updates.", "",
              "| N | consistency | step (ms) | staleness mean | p99 | max | push wait (ms) |"
              " barrier wait (ms) |", "|---|---|---|---|---|---|---|---|"]
    lines += async_rows(w, shape)
    lines += ["", "## Published results", ""]
    lines += checks_markdown(checks)
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "published.json").write_text(json.dumps(
        {k: [c.__dict__ for c in v] for k, v in checks.items()}, indent=1, default=str))
    return out / "report.md"
