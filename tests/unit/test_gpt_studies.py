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
