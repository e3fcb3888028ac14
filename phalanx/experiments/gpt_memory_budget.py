"""The largest GPT each strategy trains inside a fixed per-rank memory budget (issue 47's
study, the gpt-memory experiment's second part).

Every rank runs under ``--memory-limit BUDGET`` (``RLIMIT_AS``: what it may map beyond
its start-up, phalanx/runtime/memlimit.py). For each strategy the study searches a ladder
of GPT sizes, smallest to largest, by bisection: a size *fits* when two AdamW steps and an
evaluation finish; it does not when a rank's allocation fails past the limit (the run's
one-line ``--memory-limit`` error). Any other failure is an error of the study, not a
verdict. The search assumes what the formula says: a size that does not fit, no larger
one does. A run that fails otherwise counts as not fitting, marked and with its line in
the report (under the limit, torch's checkpoint writer has failed with "enforce fail at
inline_container.cc" rather than an allocation error). Small batches (2 windows of 64
characters per rank) keep activations small, so the weights, gradients and rule state
decide, as the ZeRO paper's table does."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.config import RunConfig
from phalanx.entry.api import train
from phalanx.errors import PhalanxError

# (layers, width, heads): 3.2M to 118M parameters, in order
LADDER: tuple[tuple[int, int, int], ...] = (
    (4, 256, 4), (8, 256, 4), (8, 384, 6), (12, 384, 6), (12, 512, 8), (16, 512, 8),
    (12, 640, 10), (16, 640, 10), (24, 640, 10))
QUICK_LADDER = LADDER[:3]
BUDGET = 768 * 2**20   # bytes per rank beyond start-up
QUICK_BUDGET = 160 * 2**20
WORKERS = 4
PROBE = {"batch_size": 2, "max_steps": 2, "test_limit": 2, "eval_every": 0, "epochs": 1.0}


def gpt_params(layers: int, dim: int, vocab: int = 65, context: int = 64) -> int:
    """Parameters of phalanx's GPT (phalanx/models/gpt.py): token and position embeddings,
    per block two LayerNorms, q/k/v/out projections and a 4x MLP (with biases), a final
    LayerNorm and the head (its own weight, no bias)."""
    block = 2 * 2 * dim + 4 * (dim * dim + dim) + (dim * 4 * dim + 4 * dim) + (4 * dim * dim
                                                                              + dim)
    return vocab * dim + context * dim + layers * block + 2 * dim + dim * vocab


@dataclass
class Probe:
    layers: int
    dim: int
    heads: int
    fits: bool
    why: str = ""
    peak_rss: int | None = None


def _probe(base: RunConfig, folder: Path, size: tuple[int, int, int], reuse: bool) -> Probe:
    layers, dim, heads = size
    out = folder / f"{layers}x{dim}"
    record = out / "probe.json"
    if reuse and record.is_file():
        return Probe(**json.loads(record.read_text()))
    cfg = dataclasses.replace(base, gpt_layers=layers, gpt_dim=dim, gpt_heads=heads,
                              out=str(out), overwrite=True)
    print(f"  {cfg.strategy}{'-' + str(cfg.zero_stage) if cfg.strategy == 'zero' else ''} "
          f"{layers}x{dim} ({gpt_params(layers, dim) / 1e6:.1f}M parameters) ...",
          file=sys.stderr, flush=True)
    try:
        s = train(config=cfg).summary
        p = Probe(layers, dim, heads, True, "", s.get("peak_rss_bytes"))
    except PhalanxError as e:  # over the budget; any other failure is shown as such
        p = Probe(layers, dim, heads, False, str(e).splitlines()[0][:300])
    out.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(dataclasses.asdict(p)) + "\n")
    return p


def largest(base: RunConfig, folder: Path, ladder: Sequence[tuple[int, int, int]], *,
            reuse: bool = False) -> tuple[int, list[Probe]]:
    """The index in ``ladder`` of the largest size that fits (-1: none), by bisection, and
    the probes run."""
    lo, hi, probes = -1, len(ladder), []
    while hi - lo > 1:
        mid = (lo + hi) // 2
        p = _probe(base, folder, ladder[mid], reuse)
        probes.append(p)
        lo, hi = (mid, hi) if p.fits else (lo, mid)
    return lo, probes


def search(make_base, out: Path, strategies: dict[str, dict[str, Any]], *, quick: bool,
           reuse: bool = False) -> list[dict[str, Any]]:
    """Per strategy: the largest ladder size inside the budget, and what was probed.
    ``make_base(folder)``: the studies' GPT configuration for a probe folder."""
    # one malloc arena per process, not one per thread: glibc reserves 64 MiB of address
    # space for each thread's arena (gloo's, autograd's, the comm thread's), which counted
    # ~200 MiB against the budget before the model's first byte (measured: a 3.2M-parameter
    # GPT did not fit in 200 MB). The ranks inherit the variable
    os.environ.setdefault("MALLOC_ARENA_MAX", "1")
    ladder = QUICK_LADDER if quick else LADDER
    budget = QUICK_BUDGET if quick else BUDGET
    rows = []
    for name, settings in strategies.items():
        base = dataclasses.replace(make_base(out / name), workers=WORKERS,
                                   memory_limit=budget, **PROBE, **settings)
        at, probes = largest(base, out / name, ladder, reuse=reuse)
        best = ladder[at] if at >= 0 else None
        rows.append({"strategy": name, "workers": WORKERS, "budget": budget,
                     "largest": None if best is None else f"{best[0]}x{best[1]}",
                     "params": None if best is None else gpt_params(best[0], best[1]),
                     "probes": [dataclasses.asdict(p) for p in probes]})
    (out / "budget.json").write_text(json.dumps(rows, indent=1) + "\n")
    return rows


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| strategy | N | budget per rank | largest GPT that trains | parameters | "
             "× DDP's | probed (fits: ✓, over the budget: ✗) |", "|---|---|---|---|---|---|---|"]
    ref = rows[0]["params"] if rows and rows[0]["params"] else None
    other: list[str] = []

    def mark(p: dict[str, Any]) -> str:
        if p["fits"]:
            return "✓"
        if "--memory-limit" in p["why"]:
            return "✗"
        other.append(p["why"])
        return f"✗[{len(other)}]"

    for r in rows:
        probed = ", ".join(f"{p['layers']}x{p['dim']} {mark(p)}"
                           for p in sorted(r["probes"], key=lambda p: gpt_params(
                               p["layers"], p["dim"])))
        times = f"{r['params'] / ref:.1f}" if ref and r["params"] else "—"
        lines.append(f"| {r['strategy']} | {r['workers']} | {r['budget'] / 2**20:.0f} MiB | "
                     f"{r['largest'] or 'none of the ladder'} | "
                     f"{(r['params'] or 0) / 1e6:.1f}M | {times} | {probed} |")
    lines += [""] + [f"[{i}] failed otherwise: {why}" for i, why in enumerate(other, 1)]
    return "\n".join(lines).rstrip()
