"""The GPT studies' verdict logic on made-up seeds (no training): the beside-single table and
its groups of identical runs, the compression tolerance, the staleness sign, and the bubble's
formula and monotonicity."""

import math

from phalanx.experiments.gpt_common import delta_cell, loss_cell, loss_vs
from phalanx.experiments.gpt_compression import TOLERANCE, within
from phalanx.experiments.gpt_pipeline_bubble import _falls_with_m, theory
from phalanx.experiments.gpt_staleness import _negate
from phalanx.experiments.gpt_strategies import beside_single, learns, same_updates
from phalanx.experiments.runs import StrategyRun
from phalanx.experiments.seeds import SeededRuns
from phalanx.experiments.stats import FAILS, HOLDS, INCONCLUSIVE


def _runs(label, losses, rate=100.0, sent=0):
    return [StrategyRun(label, {"test_loss": x, "test_perplexity": math.exp(x),
                                "tokens_per_s": rate, "bytes_sent": sent,
                                "train_tokens": 100}, []) for x in losses]


def _sr(**losses):
    return SeededRuns([0, 1, 2], {k: _runs(k, v) for k, v in losses.items()})


def test_beside_single_marks_the_reference_and_paired_differences():
    sr = _sr(single=[2.0, 2.1, 2.05], tensor=[2.0, 2.1, 2.05], sync=[2.3, 2.42, 2.34])
    text = beside_single(sr)
    rows = {ln.split(" | ")[0].strip("| "): ln for ln in text.splitlines()[2:]}
    assert "(reference)" in rows["single"]
    assert "no significant difference" in rows["tensor"] and "+0.000" in rows["tensor"]
    assert "no: higher (significant)" in rows["sync"] and "+0.303" in rows["sync"]
    assert same_updates(sr) == [["single", "tensor"]]


def test_learns_needs_every_interval_below_a_uniform_guess():
    assert learns(_sr(single=[2.0, 2.1, 2.05]))[0] is True
    holds, text = learns(_sr(single=[2.0, 2.1, 2.05], bad=[4.1, 4.3, 4.2]))
    assert holds is False and "bad" in text
    assert learns(SeededRuns([0], {"single": _runs("single", [2.0])}))[0] is None


def test_compression_within_tolerance_by_the_paired_interval():
    sr = _sr(none=[2.0, 2.1, 2.05], close=[2.01, 2.11, 2.06], far=[2.3, 2.4, 2.36],
             noisy=[1.9, 2.3, 2.05])
    assert within(sr, "close")[0] == HOLDS
    assert within(sr, "far")[0] == FAILS
    assert within(sr, "noisy")[0] == INCONCLUSIVE
    assert TOLERANCE == 0.05


def test_loss_helpers_and_the_sign_of_a_cost():
    sr = _sr(a=[2.0, 2.1, 2.05], b=[2.2, 2.3, 2.25])
    d, v = loss_vs(sr, "a", "b")  # a minus b, and "a is lower"
    assert d.mean == -0.2 or abs(d.mean + 0.2) < 1e-12
    assert v.word == HOLDS
    cost = _negate(d)
    assert abs(cost.mean - 0.2) < 1e-12 and cost.low <= cost.high
    assert delta_cell(cost).startswith("+0.200")
    assert loss_cell(sr.stat("a", "test_loss")).startswith("2.050 ± ")


def test_bubble_formula_and_monotonic_fall():
    assert theory(2, 1) == 0.5 and theory(2, 8) == 1 / 9 and theory(3, 4) == 2 / 6
    pts = [{"stages": 2, "schedule": s, "microbatches": m, "idle_mean": y}
           for s, ys in (("gpipe", (0.5, 0.3, 0.2)), ("1f1b", (0.3, 0.35, 0.1)))
           for m, y in zip((2, 4, 8), ys)]
    assert _falls_with_m(pts, (2,)) == {(2, "gpipe"): True, (2, "1f1b"): False}


def test_memory_check_expects_m_for_gpipe_and_p_minus_s_for_1f1b():
    from phalanx.experiments.gpt_pipeline_bubble import memory_check

    good = [{"label": "a", "stages": 3, "microbatches": 4, "schedule": "gpipe",
             "peak_live": [4, 4, 4]},
            {"label": "b", "stages": 3, "microbatches": 8, "schedule": "1f1b",
             "peak_live": [3, 2, 1]}]
    assert memory_check(good)[0]
    bad = good + [{"label": "c", "stages": 2, "microbatches": 4, "schedule": "1f1b",
                   "peak_live": [4, 4]}]
    ok, text = memory_check(bad)
    assert not ok and "c: [4, 4] (expected [2, 1])" in text


def test_reuse_finds_a_run_whose_rule_the_recipe_chose(tmp_path):
    """A study that leaves --rule / --lr out (the GPT's recipe fills them in when the run is
    checked) finds its finished runs again with --reuse."""
    import dataclasses
    import json

    from phalanx.experiments.gpt_common import gpt_config
    from phalanx.experiments.seeds import finished
    from phalanx.parallel.registry import check_config

    cfg = gpt_config(tmp_path / "run", quick=True, seed=0, strategy="asp", workers=2, rule="sgd",
                     lr=None, schedule="constant", warmup_steps=0, weight_decay=0.0)
    ran = check_config(dataclasses.replace(cfg))
    from phalanx.models import RECIPES

    assert cfg.lr is None and ran.rule == "adamw" and ran.lr == RECIPES["gpt"].lr
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps(ran.to_json()))
    assert not finished(cfg)  # no summary yet
    (tmp_path / "run" / "summary.json").write_text("{}")
    assert finished(cfg)
    assert not finished(dataclasses.replace(cfg, seed=1))


def _mem_run(name, n, psi=1000, k=8, loss=2.0, counted_off=0, sent=0):
    """A made-up run of the memory study: ZeRO runs carry their counts and formula."""
    from phalanx.experiments.gpt_memory import STRATEGIES, formula_of

    s = {"workers": n, "steps": 10, "test_loss": loss, "tokens_per_s": 100.0 * n,
         "bytes_sent": sent, "train_tokens": 100,
         "peak_rss_bytes_per_process": {"-1": 9e9, "0": 4e8, "1": 5e8}}
    st = STRATEGIES[name]
    if st["strategy"] == "zero":
        stage = st["zero_stage"]
        s["zero_stage"] = stage
        s["formula_params_bytes"] = 4 * psi if stage < 3 else 4 * psi // n
        s["formula_optimizer_bytes"] = k * psi // n
        f = formula_of(name, n, psi, k)
        s["held_bytes_per_rank"] = [f + counted_off] * n
        s["held_params_bytes"] = s["formula_params_bytes"]
        s["held_grads_bytes"], s["held_optimizer_bytes"] = 0, s["formula_optimizer_bytes"]
    return StrategyRun(f"{name} N={n}", s, [])


def test_memory_study_reads_psi_and_k_and_holds_counts_to_the_formula():
    from phalanx.experiments.gpt_memory import (
        formula_of,
        held_verdict,
        loss_verdict,
        markdown,
        psi_and_k,
        table_rows,
    )

    names, sizes = ("sync", "zero-1", "zero-3"), (1, 2)
    runs = {f"{s} N={n}": [_mem_run(s, n, sent=1000 * (3 if s == "zero-3" else 2))]
            for n in sizes for s in names}
    sr = SeededRuns([0], runs)
    assert psi_and_k(sr) == (1000, 8)
    # the table of docs/memory.md: DDP 16 Psi with Adam, stage 1 4+4+4/N+8/N, stage 3 16/N
    assert formula_of("sync", 2, 1000, 8) == 16000
    assert formula_of("zero-1", 2, 1000, 8) == 4000 + 6000 + 4000
    assert formula_of("zero-2", 4, 1000, 8) == 4000 + 1000 + 2000
    assert formula_of("zero-3", 4, 1000, 8) == formula_of("fsdp", 4, 1000, 8) == 4000
    rows = table_rows(sr, sizes, names)
    z3 = next(r for r in rows if r["strategy"] == "zero-3" and r["workers"] == 2)
    assert z3["bytes_vs_ddp"] == 1.5 and z3["tokens_vs_ddp"] == 1.0
    assert z3["rss"] == 5e8  # the largest rank's, not the driver's
    assert next(r for r in rows if r["strategy"] == "sync")["counted"] is None
    assert held_verdict(rows)[0] is True
    assert "not counted" in markdown(rows)
    # a stage that holds 2% more than the formula fails the 1% claim
    runs["zero-1 N=2"] = [_mem_run("zero-1", 2, counted_off=280)]
    ok, said = held_verdict(table_rows(SeededRuns([0], runs), sizes, names))
    assert ok is False and "+2.00%" in said and "zero-1 at N=2" in said
    # the loss claim: an equivalence, inside +-0.01 nats, over several seeds only
    assert loss_verdict(sr, 2)[0] is None
    eq = SeededRuns([0, 1, 2], {"sync N=4": _runs("s", [2.0, 2.1, 2.05]),
                                "zero-3 N=4": _runs("z", [2.0001, 2.1, 2.0501])})
    assert loss_verdict(eq, 4)[0] is True
    off = SeededRuns([0, 1, 2], {"sync N=4": _runs("s", [2.0, 2.1, 2.05]),
                                 "zero-3 N=4": _runs("z", [2.03, 2.12, 2.08])})
    assert loss_verdict(off, 4)[0] is False


def test_memory_budget_search_bisects_the_ladder_and_counts_parameters(monkeypatch):
    from phalanx.experiments import gpt_memory_budget as gb
    from phalanx.models.gpt import gpt

    for layers, dim, heads in ((2, 32, 2), (4, 128, 4)):
        model = gpt((64,), 65, layers=layers, dim=dim, heads=heads)
        assert gb.gpt_params(layers, dim) == sum(p.numel() for p in model.parameters())
    ladder = gb.LADDER
    for fits_up_to in range(-1, len(ladder)):
        seen = []

        def probe(base, folder, size, reuse, limit=fits_up_to, seen=seen):
            seen.append(size)
            return gb.Probe(*size, fits=ladder.index(size) <= limit,
                            why="" if ladder.index(size) <= limit else "--memory-limit 1: x")

        monkeypatch.setattr(gb, "_probe", probe)
        at, probes = gb.largest(None, None, ladder)
        assert at == fits_up_to and len(probes) == len(seen) <= 4  # 9 sizes: 4 probes
    sizes = [gb.gpt_params(layers, dim) for layers, dim, _ in ladder]
    assert sizes == sorted(sizes)  # bisection needs the ladder in order
    rows = [{"strategy": "sync", "workers": 4, "budget": 2**20, "largest": "4x256",
             "params": 100, "probes": [{"layers": 4, "dim": 256, "fits": True, "why": ""},
                                       {"layers": 8, "dim": 256, "fits": False,
                                        "why": "--memory-limit 1: over"}]},
            {"strategy": "zero-3", "workers": 4, "budget": 2**20, "largest": None,
             "params": None, "probes": [{"layers": 4, "dim": 256, "fits": False,
                                         "why": "worker 0 failed: something else"}]}]
    text = gb.markdown(rows)
    assert "4x256 ✓, 8x256 ✗ |" in text and "none of the ladder" in text
    assert "4x256 ✗[1]" in text and "[1] failed otherwise: worker 0 failed" in text
