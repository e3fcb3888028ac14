"""Claim 5: in a ring allreduce every worker sends 2X(N-1)/N bytes; through a main node,
that node moves 2X(N-1) (X(N-1) in, X(N-1) out). Measured with real processes and the
allreduce implementations' own byte counters."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from phalanx.comm.allreduce import MainNodeAllReduce, RingAllReduce
from phalanx.comm.counters import ByteCounter
from phalanx.experiments.common import verdict_block
from phalanx.metrics import plots
from phalanx.runtime.launch import spawn


def _measure(rank: int, world: int, numel: int, out_dir: str) -> None:
    result = {}
    for name, cls in (("ring", RingAllReduce), ("main", MainNodeAllReduce)):
        counter = ByteCounter()
        op = cls(None, counter)
        t = torch.full((numel,), float(rank + 1))
        op(t)
        # the sum of 1..N everywhere is also the correctness check of the measurement run
        if not torch.all(t == world * (world + 1) / 2):
            raise RuntimeError(f"{name} allreduce gave a wrong sum on rank {rank}")
        result[name] = {"sent": counter.sent, "received": counter.received}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))


def run(out: Path, *, quick: bool, data: str | None, seed: int) -> Path:
    sizes = (2, 3, 4) if quick else (2, 3, 4, 6, 8)
    numel = 1 << 18  # X = 1 MiB of float32
    x_bytes = numel * 4
    out.mkdir(parents=True, exist_ok=True)
    rows = ["| N | ring: max bytes sent per rank | 2X(N-1)/N | main node: bytes moved | "
            "2X(N-1) | other ranks (main) |", "|---|---|---|---|---|---|"]
    ring_pts, ring_formula, main_pts, main_formula = [], [], [], []
    ok = True
    for n in sizes:
        tmp = out / f"n{n}"
        tmp.mkdir(exist_ok=True)
        spawn(_measure, n, (numel, str(tmp)))
        ranks = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(n)]
        ring_sent = max(r["ring"]["sent"] for r in ranks)
        main_moved = ranks[0]["main"]["sent"] + ranks[0]["main"]["received"]
        other = max(r["main"]["sent"] + r["main"]["received"] for r in ranks[1:])
        f_ring, f_main = 2 * x_bytes * (n - 1) / n, 2 * x_bytes * (n - 1)
        ok = ok and abs(ring_sent - f_ring) <= 4 * n and main_moved == f_main
        rows.append(f"| {n} | {ring_sent:,} | {f_ring:,.0f} | {main_moved:,} | {f_main:,} | "
                    f"{other:,} |")
        ring_pts.append(ring_sent / x_bytes)
        ring_formula.append(f_ring / x_bytes)
        main_pts.append(main_moved / x_bytes)
        main_formula.append(f_main / x_bytes)
    plots.line_plot(out / "traffic.png", {
        "ring, measured (per rank)": (list(sizes), ring_pts),
        "2(N-1)/N": (list(sizes), ring_formula),
        "main node, measured": (list(sizes), main_pts),
        "2(N-1)": (list(sizes), main_formula)},
        xlabel="workers N", ylabel="bytes moved / X", title="Allreduce traffic for X = 1 MiB",
        reference=("2(N-1)/N", "2(N-1)"))
    measured = (f"for X = {x_bytes:,} bytes the ring's busiest rank sent "
                + ", ".join(f"{p:.3f}X at N={n}" for p, n in zip(ring_pts, sizes))
                + "; the main node moved " + ", ".join(f"{p:.0f}X" for p in main_pts) + ".")
    text = "\n\n".join([
        "# Ring vs main-node allreduce traffic",
        "Reproduce:\n\n```sh\nphalanx experiments run ring-traffic" + (" --quick" if quick
                                                                          else "") + "\n```",
        verdict_block("ring: 2X(N-1)/N per worker (bounded by 2X); main node: 2X(N-1), "
                      "growing with N", measured, ok),
        "\n".join(rows), "![traffic](traffic.png)",
        "Bytes come from the counters inside `RingAllReduce` and `MainNodeAllReduce` "
        "(`phalanx/comm/allreduce.py`) on real gloo processes; chunks differ by at most one "
        "element when N does not divide X, hence the few-byte differences."])
    path = out / "report.md"
    path.write_text(text + "\n")
    return path
