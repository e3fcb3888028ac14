"""Memory against workers on the GPT (issue 47): the bytes each rank holds under DDP
(``sync``), ZeRO stages 1-3 (``zero``) and torch's FSDP2 (``fsdp``) at N = 1, 2, 4, beside
the formula of docs/memory.md; peak RSS, bytes moved per step and tokens/s beside DDP's;
and, over seeds, ZeRO-3's validation loss beside sync's at the same tokens.

Every run trains the same token budget (the N workers share it), so the runs at the
largest N serve both questions: seed 0 runs every strategy at every N, the other seeds
only sync and ZeRO-3 at the largest N (the loss comparison).

What is counted: ZeRO's ranks count their tensors at the end of each backward
(``held_*_bytes``, phalanx/parallel/zero_memory.py). DDP and FSDP2 do not count theirs;
their rows give the formula (DDP: 4Psi + 4Psi + KPsi; FSDP2 shards as stage 3) and the
measured peak RSS, which every strategy reports. Psi and K are read from the ZeRO runs'
own formula fields, not assumed."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from phalanx.experiments.common import variant, verdict_block
from phalanx.experiments.gpt_common import (
    delta_cell,
    gpt_config,
    load_now,
    loss_cell,
    seeds_flag,
    study_load,
)
from phalanx.experiments.gpt_memory_budget import markdown as budget_markdown
from phalanx.experiments.gpt_memory_budget import search
from phalanx.experiments.seeds import SeededRuns, run_seeded, write_seeded_report
from phalanx.experiments.stats import summarize
from phalanx.metrics import plots

SIZES = (1, 2, 4)
QUICK_SIZES = (2,)
# label -> settings; the first is the reference (DDP). Our ring's collectives, whose bytes
# are counted (the backend's are estimated by the formula; FSDP2's are the backend's)
STRATEGIES: dict[str, dict[str, Any]] = {
    "sync": {"strategy": "sync", "allreduce": "ring"},
    "zero-1": {"strategy": "zero", "zero_stage": 1, "allreduce": "ring"},
    "zero-2": {"strategy": "zero", "zero_stage": 2, "allreduce": "ring"},
    "zero-3": {"strategy": "zero", "zero_stage": 3, "allreduce": "ring"},
    "fsdp": {"strategy": "fsdp"},
}
QUICK_STRATEGIES = ("sync", "zero-1", "zero-3")
LOSS_PAIR = ("sync", "zero-3")
# the default GPT (4 blocks of width 128, 0.8M parameters), not the studies' smaller one
MODEL = {"gpt_layers": 4, "gpt_dim": 128, "gpt_heads": 4}
BUDGET_SETUP = (
    "Every rank under `--memory-limit` (RLIMIT_AS: what it may map beyond its start-up), "
    "N = 4, each strategy's largest size found by bisection over a ladder of GPTs (2 AdamW "
    "steps and an evaluation must finish; a size that does not fit is the run's one-line "
    "`--memory-limit` error), 2 windows per rank so the weights, gradients and rule state "
    "decide (phalanx/experiments/gpt_memory_budget.py). Address space, not resident "
    "memory: thread stacks count, and so would glibc's per-thread allocator arenas (64 MiB "
    "of address space each), so the ranks run with `MALLOC_ARENA_MAX=1`.")
EQUAL_NATS = 0.01  # "the same loss": the paired difference's 95% interval inside +-this
HELD_SLACK = 0.01  # counted within 1% of the formula (padding, step counters)


def label(name: str, n: int) -> str:
    return f"{name} N={n}"


def plan(quick: bool) -> tuple[tuple[int, ...], tuple[str, ...]]:
    return (QUICK_SIZES, QUICK_STRATEGIES) if quick else (SIZES, tuple(STRATEGIES))


def variants(seed: int, folder: Path, *, quick: bool, first: bool):
    sizes, names = plan(quick)
    base = gpt_config(folder, quick=quick, seed=seed, rule="adamw", **MODEL)
    chosen = [(s, n) for n in sizes for s in names] if first else [
        (s, sizes[-1]) for s in LOSS_PAIR]
    # one evaluation, at the end: an evaluation gathers every unit (stage 3, FSDP2), which
    # would count as a training step's bytes
    return [(lb, dataclasses.replace(cfg, eval_every=0)) for lb, cfg in (
        variant(base, folder, label(s, n), workers=n, **STRATEGIES[s]) for s, n in chosen)]


def _get(summary: dict[str, Any], key: str) -> float | None:
    v = summary.get(key)
    return float(v) if isinstance(v, (int, float)) else None


def formula_of(name: str, n: int, psi: float, k: float) -> float:
    """Bytes per rank by docs/memory.md's table (fp32; K bytes of rule state per value)."""
    shard = {"sync": (4 * psi, 4 * psi, k * psi),
             "zero-1": (4 * psi, 4 * psi + 4 * psi / n, k * psi / n),
             "zero-2": (4 * psi, 4 * psi / n, k * psi / n),
             "zero-3": (4 * psi / n, 4 * psi / n, k * psi / n),
             "fsdp": (4 * psi / n, 4 * psi / n, k * psi / n)}[name]
    return sum(shard)


def psi_and_k(sr: SeededRuns) -> tuple[float, float]:
    """Psi (parameters) and K (rule bytes per parameter) from a ZeRO run's own formula
    fields: stage 1 and 2 hold 4 Psi of parameters; the rule's state is K Psi / N."""
    for lb in sr.labels:
        s = sr.first(lb).summary
        if s.get("zero_stage") in (1, 2) and _get(s, "formula_params_bytes"):
            psi = _get(s, "formula_params_bytes") / 4
            return psi, _get(s, "formula_optimizer_bytes") * int(s["workers"]) / psi
    raise ValueError("gpt-memory: no ZeRO stage 1 or 2 run to read the formula from")


def rank_rss(summary: dict[str, Any]) -> float | None:
    """The largest rank's peak RSS (the driver, -1, left out)."""
    per = summary.get("peak_rss_bytes_per_process") or {}
    ranks = [v for r, v in per.items() if str(r) != "-1" and isinstance(v, (int, float))]
    return float(max(ranks)) if ranks else _get(summary, "peak_rss_bytes")


def table_rows(sr: SeededRuns, sizes: Sequence[int], names: Sequence[str]
               ) -> list[dict[str, Any]]:
    """One row per (strategy, N) of seed 0."""
    psi, k = psi_and_k(sr)
    rows = []
    for n in sizes:
        ref = sr.first(label(names[0], n)).summary
        ref_step = (_get(ref, "bytes_sent") or 0) / max(1, int(ref.get("steps") or 1))
        for name in names:
            s = sr.first(label(name, n)).summary
            counted = s.get("held_bytes_per_rank")
            step = (_get(s, "bytes_sent") or 0) / max(1, int(s.get("steps") or 1))
            rows.append({
                "strategy": name, "workers": n,
                "counted": float(max(counted)) if counted else None,
                "params": _get(s, "held_params_bytes"), "grads": _get(s, "held_grads_bytes"),
                "optimizer": _get(s, "held_optimizer_bytes"),
                "formula": formula_of(name, n, psi, k),
                "rss": rank_rss(s), "bytes_per_step": step,
                "bytes_vs_ddp": step / ref_step if ref_step else None,
                "tokens_per_s": _get(s, "tokens_per_s"),
                "tokens_vs_ddp": ((_get(s, "tokens_per_s") or 0) / _get(ref, "tokens_per_s")
                                  if _get(ref, "tokens_per_s") else None),
                "estimated": bool(s.get("bytes_estimated"))})
    return rows


def _mb(v: float | None) -> str:
    return "—" if v is None else f"{v / 2**20:,.2f}"


def _x(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| strategy | N | counted per rank (MiB) | params / grads / rule state (MiB) | "
             "formula (MiB) | counted / formula | peak RSS of a rank (MiB) | bytes moved per "
             "step (MiB, all ranks) | × DDP | tokens/s | × DDP |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        parts = ("—" if r["params"] is None else
                 f"{_mb(r['params'])} / {_mb(r['grads'])} / {_mb(r['optimizer'])}")
        ratio = _x(r["counted"] / r["formula"]) if r["counted"] else "not counted"
        est = " (formula)" if r["estimated"] else ""
        lines.append(f"| {r['strategy']} | {r['workers']} | {_mb(r['counted'])} | {parts} | "
                     f"{_mb(r['formula'])} | {ratio} | {_mb(r['rss'])} | "
                     f"{_mb(r['bytes_per_step'])}{est} | {_x(r['bytes_vs_ddp'])} | "
                     f"{r['tokens_per_s'] or 0:,.0f} | {_x(r['tokens_vs_ddp'])} |")
    return "\n".join(lines)


def held_verdict(rows: Sequence[dict[str, Any]]) -> tuple[bool, str]:
    counted = [r for r in rows if r["counted"]]
    worst = max(counted, key=lambda r: abs(r["counted"] / r["formula"] - 1))
    off = worst["counted"] / worst["formula"] - 1
    return abs(off) <= HELD_SLACK, (
        f"every ZeRO run's counted bytes per rank against the formula: at most {off:+.2%} "
        f"off ({worst['strategy']} at N={worst['workers']}; {len(counted)} runs)")


def loss_verdict(sr: SeededRuns, n: int) -> tuple[bool | None, str]:
    a, b = (sr.values(label(s, n), "test_loss") for s in reversed(LOSS_PAIR))
    d = summarize([x - y for x, y in zip(a, b)])
    said = (f"zero-3 minus sync at N={n}, paired over {d.n} seed(s): {delta_cell(d)} nats/"
            f"token (sync {loss_cell(sr.stat(label('sync', n), 'test_loss'))}, zero-3 "
            f"{loss_cell(sr.stat(label('zero-3', n), 'test_loss'))})")
    if d.n < 2:
        return None, said + "; one seed: no interval"
    return (-EQUAL_NATS <= d.low and d.high <= EQUAL_NATS), said


def run(out: Path, *, quick: bool, data: str | None, seeds: Sequence[int],
        reuse: bool = False) -> Path:
    before = load_now()
    sizes, names = plan(quick)
    sr = run_seeded(lambda seed, folder: variants(seed, folder, quick=quick,
                                                  first=seed == seeds[0]),
                    out, seeds, reuse=reuse)
    rows = table_rows(sr, sizes, names)
    out.mkdir(parents=True, exist_ok=True)
    plots.line_plot(out / "held_vs_workers.png",
                    {**{f"{s} (formula)": (list(sizes), [r["formula"] / 2**20 for r in rows
                                                        if r["strategy"] == s])
                        for s in names},
                     **{f"{s} (counted)": (list(sizes), [r["counted"] / 2**20 for r in rows
                                                        if r["strategy"] == s])
                        for s in names if s.startswith("zero")}},
                    xlabel="workers N", ylabel="bytes held per rank (MiB)",
                    title="Weights, gradients and rule state held per rank (GPT, AdamW)",
                    reference=[f"{s} (formula)" for s in names])
    held_ok, held_said = held_verdict(rows)
    loss_ok, loss_said = loss_verdict(sr, sizes[-1])
    three = [r for r in rows if r["strategy"] == "zero-3" and r["workers"] == sizes[-1]]
    moved = (f" ZeRO-3 moves {_x(three[0]['bytes_vs_ddp'])}x DDP's bytes per step at "
             f"N={sizes[-1]} (the ZeRO paper: 1.5x)." if three and three[0]["bytes_vs_ddp"]
             else "")
    holds = None if loss_ok is None else bool(held_ok and loss_ok)
    pre = verdict_block(
        "ZeRO's ranks hold the bytes of docs/memory.md's formula (counted within "
        f"{HELD_SLACK:.0%}), and ZeRO-3 trains the GPT to sync's validation loss at the same "
        f"tokens (the paired difference's 95% interval inside ±{EQUAL_NATS} nats)",
        f"{held_said}; {loss_said}.{moved}", holds)
    pre += ("\n\nSet-up: the default GPT (4 blocks of width 128, 4 heads, about 0.8M "
            "parameters) on 64-character windows of Tiny Shakespeare, batch 16 per worker, "
            "AdamW (the GPT studies' recipe), the same token budget at every N (the workers "
            "share it), one intra-op thread per process. Bytes held: fp32 throughout, "
            "counted at the end of backward; DDP's and FSDP2's rows are the formula's (they "
            "do not count their tensors) beside their measured peak RSS, which is mostly "
            "torch's own runtime (~350-450 MiB a process) at this model size.")
    pre += "\n\n" + study_load(out, before, reuse=reuse)
    pre += "\n\nSeed " + str(seeds[0]) + ", every strategy at every N:\n\n" + markdown(rows)
    pre += "\n\n![bytes held per rank](held_vs_workers.png)"
    budget = search(lambda folder: gpt_config(folder, quick=quick, seed=seeds[0],
                                              rule="adamw"),
                    out / "budget", {s: STRATEGIES[s] for s in names}, quick=quick,
                    reuse=reuse)
    pre += ("\n\n## The largest GPT inside a per-rank budget\n\n" + BUDGET_SETUP
            + "\n\n" + budget_markdown(budget))
    return write_seeded_report(sr, out, title="Memory against workers: DDP, ZeRO 1-3 and "
                               "FSDP2 (GPT)", target=0.0, preamble=pre,
                               command="phalanx experiments run gpt-memory"
                               + (" --quick" if quick else "") + seeds_flag(seeds))
