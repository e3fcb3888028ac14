"""A seeded study of a language model reports loss, perplexity, tokens/s and bytes per token:
the table, the lower-better pairwise verdicts, the derived bytes per token, the report's
plots and compare's text set-up line (on made-up summaries: no training)."""

import json
import math

from phalanx.config import RunConfig
from phalanx.experiments.compare import lm_setup
from phalanx.experiments.lm_figures import bytes_per_token, is_lm, value_of
from phalanx.experiments.runs import StrategyRun
from phalanx.experiments.seeds import (
    SeededRuns,
    pairwise_verdicts,
    seeded_table,
    write_seeded_report,
)


def _run(label, loss, rate, sent=0, seed=0):
    summary = {"strategy": label, "workers": 2, "test_loss": loss,
               "test_perplexity": math.exp(loss), "test_accuracy": 0.3, "tokens_per_s": rate,
               "samples_per_s": rate / 64, "startup_s": 0.5, "bytes_sent": sent,
               "train_tokens": 1000, "bytes_per_sample": sent / 1000 * 64, "data_context": 64}
    evals = [{"kind": "eval", "wall_s": w, "samples": 10 * w, "test_loss": loss + 1 / w,
              "test_accuracy": 0.3, "test_perplexity": math.exp(loss)} for w in (1, 2, 3)]
    return StrategyRun(label, summary, evals)


def _seeded():
    # "good" is lower in loss by 0.5 on every seed; "fast" has the higher throughput
    return SeededRuns([0, 1, 2], {
        "good": [_run("good", 2.0 + d, 100.0 + d, 0) for d in (0.0, 0.01, 0.02)],
        "fast": [_run("fast", 2.5 + d, 900.0 + d, 4000) for d in (0.0, 0.03, 0.01)]})


def test_lm_runs_are_recognised_and_bytes_per_token_derived():
    s = _run("x", 2.0, 1.0, sent=5000).summary
    assert is_lm(s) and not is_lm({"test_accuracy": 0.9})
    assert bytes_per_token(s) == 5.0 == value_of(s, "bytes_per_token")
    # a strategy that reports only bytes per sample: a sample is `context` tokens
    assert bytes_per_token({"bytes_per_sample": 128.0, "data_context": 64}) == 2.0
    assert value_of(s, "test_loss") == 2.0


def test_table_shows_loss_perplexity_tokens_and_bytes_per_token():
    sr = _seeded()
    assert sr.lm and sr.key == "test_loss"
    text = seeded_table(sr, target=0.8)
    head = text.splitlines()[0]
    for column in ("val loss", "95% CI", "perplexity", "tokens/s", "bytes/token"):
        assert column in head
    assert "test acc" not in head and "time to" not in head
    rows = text.splitlines()[2:]
    assert rows[0].startswith("| fast ")  # fastest by tokens/s first
    assert "| 4 |" in rows[0]  # 4000 bytes / 1000 tokens
    assert f"{math.exp(2.01):.2f}" in rows[1]  # perplexity of the mean loss


def test_pairwise_verdicts_take_lower_loss_as_better():
    text = pairwise_verdicts(_seeded())
    assert "good < fast in validation loss" in text
    assert "fast > good in steady-state tokens/s" in text
    line = next(ln for ln in text.splitlines() if "validation loss" in ln)
    assert "**holds**" in line


def test_report_plots_loss_and_keeps_every_seed(tmp_path):
    sr = _seeded()
    report = write_seeded_report(sr, tmp_path, title="t", target=0.8)
    text = report.read_text()
    assert "Validation loss per seed" in text and "loss_vs_tokens.png" in text
    for name in ("loss_vs_time.png", "loss_vs_tokens.png", "bytes_per_token.png"):
        assert (tmp_path / name).stat().st_size > 0
    rows = json.loads((tmp_path / "results.json").read_text())
    good = next(r for r in rows if r["label"] == "good")
    assert good["test_loss"]["n"] == 3 and good["bytes_per_token"]["mean"] == 0.0
    assert good["test_loss"]["ci95"][0] < 2.01 < good["test_loss"]["ci95"][1]


def test_image_studies_keep_their_accuracy_table():
    sr = SeededRuns([0], {"a": [StrategyRun("a", {"test_accuracy": 0.8}, [])]})
    assert not sr.lm and "test acc" in seeded_table(sr, target=0.5)


def test_compare_describes_a_text_budget_in_tokens():
    cfg = RunConfig(model="gpt", data="shakespeare", context=64, epochs=0.1, test_limit=256)
    line = lm_setup(cfg)
    assert "64 char tokens" in line and "305,914 training tokens" in line
    assert "first 256 windows" in line
    assert lm_setup(RunConfig(model="lenet5", data="fashion-mnist")) == ""
