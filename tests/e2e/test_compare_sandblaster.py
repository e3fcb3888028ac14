"""`phalanx compare --strategies downpour,sandblaster`: both train on the same budget of
samples (Sandblaster counts the samples of every function evaluation) and get a row."""

import json

from phalanx.cli import main


def test_compare_downpour_with_sandblaster(tmp_path, capsys):
    out = tmp_path / "cmp"
    code = main(["compare", "--strategies", "downpour,sandblaster", "--workers", "2",
                 "--servers", "1", "--model", "mlp", "--data", "synthetic", "--epochs", "8",
                 "--train-limit", "1024", "--rule", "adam", "--lr", "0.001", "--nfetch", "2",
                 "--npush", "2", "--target-accuracy", "0.5", "--no-tensorboard",
                 "--out", str(out)])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    report = (out / "report.md").read_text()
    assert "| sandblaster | sandblaster | 2 |" in report and "| downpour | downpour | 2 |" in report
    results = {r["label"]: r for r in json.loads((out / "results.json").read_text())}
    sb = results["sandblaster"]["summary"]
    assert sb["test_accuracy"] > 0.5 and sb["line_search"] == "backtracking"
    # 8 passes over 1024 samples: as many samples as Downpour's 8 epochs
    assert sb["train_samples"] == 8 * 1024 == sb["function_evals"] * 1024
    assert results["sandblaster"]["runs"][0]["samples_to_target"] is not None
    evals = [json.loads(ln) for ln in (out / "sandblaster" / "events.jsonl").read_text()
             .splitlines() if '"eval"' in ln]
    assert len(evals) >= 2 and evals[-1]["samples"] == 8 * 1024


def test_compare_refuses_a_budget_sandblaster_cannot_train_in(tmp_path, capsys):
    """3 passes = 2 L-BFGS iterations (test accuracy 0.18 on this set-up): refused before
    anything runs, naming the setting and the floor."""
    out = tmp_path / "cmp"
    code = main(["compare", "--strategies", "single,sandblaster", "--model", "mlp", "--data",
                 "synthetic", "--epochs", "3", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and not (out.exists() and any(out.iterdir()))  # nothing ran
    assert err.strip() == ("phalanx: error: --epochs 3: sandblaster gets 3 full-batch passes "
                           "(at most 2 L-BFGS iterations), too few to train; give --epochs "
                           ">= 5 or leave sandblaster out")
