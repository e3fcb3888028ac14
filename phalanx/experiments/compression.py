"""Compression x protocol: final test accuracy against bytes moved per training sample, for
every compressor under sync data parallel, ASP (parameter server), averaging every 8 steps
and DiLoCo (Nesterov outer step) every 8 and 32 steps. The frontier (no other run has at
least its accuracy with fewer bytes) says which pairs are worth running."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from pathlib import Path

from phalanx.config import RunConfig
from phalanx.entry.api import train
from phalanx.experiments.common import verdict_block
from phalanx.experiments.runs import StrategyRun, read_run
from phalanx.metrics import plots

COMPRESSORS = ("none", "topk:0.01", "powersgd:2", "fp16", "int8", "randk:0.01", "bf16")
# CI-sized: one pair per hook (sync buckets, averaging deltas, PS pushes/pulls)
QUICK_PAIRS = (("sync", "none"), ("sync", "topk:0.01"), ("diloco H=8", "powersgd:2"),
               ("asp", "int8"))
PROTOCOLS = {  # label -> RunConfig changes (in the order they run)
    "sync": {"strategy": "sync"},
    "avg k=8": {"strategy": "average", "period": 8},
    "diloco H=8": {"strategy": "average", "period": 8, "outer_rule": "nesterov",
                   "outer_lr": 0.7, "outer_momentum": 0.9},
    "asp": {"strategy": "asp"},
    "diloco H=32": {"strategy": "average", "period": 32, "outer_rule": "nesterov",
                    "outer_lr": 0.7, "outer_momentum": 0.9},
}


def base(out: Path, *, quick: bool, data: str | None, seed: int) -> RunConfig:
    """Quick: MLP, 1,000 synthetic samples, 2 workers (CI-sized). Full: LeNet-5 on the first
    4,000 Fashion-MNIST images for one epoch at batch 16, 4 workers (62 steps a worker, so
    DiLoCo at H=32 syncs twice), tested on 2,000 images: sized for 34 runs on 2 cores shared
    with other jobs."""
    if quick:
        return RunConfig(model="mlp", data=data or "synthetic", epochs=1, batch_size=32,
                         train_limit=1000, test_limit=500, workers=2, lr=0.05, seed=seed,
                         out=str(out), progress=False, tensorboard=False, threads=1)
    return RunConfig(model="lenet5", data=data or "fashion-mnist", epochs=1, batch_size=16,
                     train_limit=4000, test_limit=2000, workers=4, lr=0.05, seed=seed, out=str(out),
                     progress=False, tensorboard=False, threads=1)


def grid(cfg: RunConfig, out: Path, quick: bool) -> list[tuple[str, RunConfig]]:
    # compressor-major order: an interrupted study has every protocol for the first ones
    pairs = QUICK_PAIRS if quick else [(p, c) for c in COMPRESSORS for p in PROTOCOLS]
    out_list = []
    for proto, comp in pairs:
        changes = PROTOCOLS[proto]
        if comp.startswith("powersgd") and changes["strategy"] == "asp":
            continue  # PowerSGD needs an allreduce group (rejected by the config)
        label = f"{proto} | {comp}"
        safe = label.replace(" | ", "__").replace(" ", "").replace("=", "").replace(":", "-")
        out_list.append((label, dataclasses.replace(cfg, out=str(out / safe), compress=comp,
                                                    **changes).validate()))
    return out_list


def run_or_reuse(variants: list[tuple[str, RunConfig]]) -> list[StrategyRun]:
    """Train each variant, or read it back when its folder already has a summary (a long
    study that was interrupted continues where it stopped)."""

    runs = []
    for i, (label, cfg) in enumerate(variants, 1):
        done = Path(cfg.out) / "summary.json"
        if not done.is_file():
            t0 = time.perf_counter()
            print(f"[{i}/{len(variants)}] {label} ...", file=sys.stderr, flush=True)
            s = train(config=cfg).summary
            print(f"[{i}/{len(variants)}] {label}: test accuracy {s['test_accuracy']:.4f} "
                  f"in {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
        runs.append(read_run(label, Path(cfg.out)))
    return runs


def matrix(points: list[tuple[str, float, float]]) -> str:
    """Protocols x compressors: "accuracy / bytes per sample" in each cell."""
    cell = {label: f"{a:.3f} / {b:,.0f}" for label, b, a in points}
    protos = list(dict.fromkeys(label.split(" | ")[0] for label, _, _ in points))
    comps = list(dict.fromkeys(label.split(" | ")[1] for label, _, _ in points))
    lines = ["| protocol \\ compressor | " + " | ".join(comps) + " |",
             "|---" * (len(comps) + 1) + "|"]
    for p in protos:
        lines.append(f"| {p} | " + " | ".join(cell.get(f"{p} | {c}", "—") for c in comps) + " |")
    return ("Test accuracy / bytes moved per training sample (all ranks together):\n\n"
            + "\n".join(lines))


def frontier(points: list[tuple[str, float, float]]) -> list[str]:
    """Labels of the (label, bytes, accuracy) points no other point dominates (fewer or
    equal bytes and higher or equal accuracy, one of them strictly)."""
    out = []
    for label, b, a in points:
        if not any((b2 <= b and a2 >= a) and (b2 < b or a2 > a) for _, b2, a2 in points):
            out.append(label)
    return out


def run(out: Path, *, quick: bool, data: str | None, seed: int) -> Path:
    cfg = base(out, quick=quick, data=data, seed=seed)
    return write(out, run_or_reuse(grid(cfg, out, quick)), cfg, quick=quick, seed=seed)


def finished(out: Path, *, quick: bool = False, data: str | None = None,
             seed: int = 0) -> list[StrategyRun]:
    """The runs of the grid that have finished (for a report on a partial grid)."""
    cfg = base(out, quick=quick, data=data, seed=seed)
    return [read_run(label, Path(c.out)) for label, c in grid(cfg, out, quick)
            if (Path(c.out) / "summary.json").is_file()]


def write(out: Path, runs: list[StrategyRun], cfg: RunConfig, *, quick: bool,
          seed: int, note: str = "") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    points = [(r.label, float(r.summary["bytes_per_sample"]), float(r.summary["test_accuracy"]))
              for r in runs]
    front = frontier(points)
    series: dict[str, tuple[list[float], list[float]]] = {}
    for label, b, a in points:
        series.setdefault(label.split(" | ")[1], ([], []))
        series[label.split(" | ")[1]][0].append(b)
        series[label.split(" | ")[1]][1].append(a)
    plots.scatter_plot(out / "accuracy_vs_bytes.png", series, xlabel="bytes per sample (log)",
                       ylabel="final test accuracy",
                       title=f"Compression x protocol ({cfg.model}, N={cfg.workers})",
                       frontier=[(b, a) for label, b, a in sorted(points, key=lambda p: p[1])
                                 if label in front])
    best_plain = max(a for label, b, a in points if label.endswith("| none"))
    plain_bytes = min(b for label, b, a in points if label.endswith("| none"))
    rows = ["| protocol | compressor | test accuracy | bytes/sample | on frontier |",
            "|---|---|---|---|---|"]
    for label, b, a in sorted(points, key=lambda p: p[1]):
        proto, comp = label.split(" | ")
        mark = "yes" if label in front else ""
        rows.append(f"| {proto} | {comp} | {a:.4f} | {b:,.0f} | {mark} |")
    # the claim: compression moves the frontier — a compressed pair comes within 1 point of
    # the best uncompressed accuracy with at least 10x fewer bytes than any uncompressed run
    winners = [(label, b, a) for label, b, a in points if not label.endswith("| none")
               and a >= best_plain - 0.01 and b * 10 <= plain_bytes]
    measured = (f"best uncompressed accuracy {best_plain:.4f}; cheapest uncompressed run "
                f"{plain_bytes:,.0f} bytes/sample. Frontier: {', '.join(front)}. Compressed "
                "pairs within 1 point of the best uncompressed accuracy at >= 10x fewer bytes: "
                + (", ".join(f"{lbl} ({a:.4f}, {b:,.0f} B)" for lbl, b, a in winners)
                   or "none"))
    holds = bool(winners) if not quick else None
    pre = verdict_block("compressed protocol pairs lie on the accuracy-vs-bytes frontier: one "
                        "comes within 1 point of the best uncompressed accuracy with >= 10x "
                        "fewer bytes per sample than any uncompressed run", measured, holds)
    pre += ("\n\nOne seed per pair (seed " + str(seed) + "); accuracy differences below about "
            "1 point are within run-to-run noise at this size." + (" " + note if note else "")
            + "\n\n" + matrix(points) + "\n\n" + "\n".join(rows)
            + "\n\n![accuracy vs bytes](accuracy_vs_bytes.png)")
    cmd = "phalanx experiments run compression" + (" --quick" if quick else "")
    parts = ["# Compression x protocol: accuracy against bytes", "", pre, "", "Reproduce:", "",
             "```sh", cmd, "```", ""]
    path = out / "report.md"
    path.write_text("\n".join(parts) + "\n")
    (out / "results.json").write_text(json.dumps(
        [{"label": lbl, "bytes_per_sample": b, "test_accuracy": a, "frontier": lbl in front}
         for lbl, b, a in points], indent=2) + "\n")
    if not all(math.isfinite(b) for _, b, _ in points):
        raise RuntimeError("a run reported no bytes")
    return path
