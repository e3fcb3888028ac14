"""`phalanx compare` and the quick version of every experiment, as a user runs them."""

import json

import pytest

from phalanx.cli import main
from phalanx.experiments import EXPERIMENTS


def run_main(capsys, *args):
    try:
        code = main(list(args))
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr()


def test_compare_writes_report_table_and_plots(tmp_path, capsys):
    out = tmp_path / "cmp"
    code, cap = run_main(capsys, "compare", "--strategies", "single,asp", "--workers", "2",
                         "--model", "mlp", "--data", "synthetic", "--epochs", "1",
                         "--train-limit", "1024", "--target-accuracy", "0.3",
                         "--no-tensorboard", "--out", str(out))
    assert code == 0, cap.err
    report = (out / "report.md").read_text()
    assert "| single | single | 1 |" in report and "| asp | asp | 2 |" in report
    for png in ("accuracy_vs_time", "accuracy_vs_samples", "staleness", "bytes_per_sample"):
        assert (out / f"{png}.png").stat().st_size > 5000
        assert f"({png}.png)" in report
    results = json.loads((out / "results.json").read_text())
    asp = next(r for r in results if r["label"] == "asp")
    assert asp["summary"]["staleness_max"] >= 1 and asp["summary"]["bytes_per_sample"] > 0
    assert "[1/2] single" in cap.err and "[2/2] asp" in cap.err  # one progress line per run
    assert "report:" in cap.out


@pytest.mark.parametrize("args, needle", [
    (["--strategies", "single,foo"], "--strategies: 'foo' is not one of"),
    (["--strategies", "asp,asp"], "names a strategy twice"),
    (["--strategies", "single", "--target-accuracy", "2"], "--target-accuracy: 2.0"),
])
def test_compare_bad_input(tmp_path, capsys, args, needle):
    code, cap = run_main(capsys, "compare", *args, "--out", str(tmp_path))
    assert code == 2 and needle in cap.err and cap.err.count("\n") == 1


def test_experiments_list(capsys):
    code, cap = run_main(capsys, "experiments", "list")
    assert code == 0
    for name in EXPERIMENTS:
        assert name in cap.out


def test_unknown_experiment(capsys):
    code, cap = run_main(capsys, "experiments", "run", "nope")
    assert code == 2 and "'nope' is not one of" in cap.err


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_quick_experiment_states_a_verdict(tmp_path, capsys, name):
    if name == "bandwidth":  # runs on test hosts: network namespaces (root)
        from phalanx.runtime.hosts import unavailable

        if unavailable() is not None:
            pytest.skip(f"bandwidth needs test hosts: {unavailable()}")
    out = tmp_path / name
    code, cap = run_main(capsys, "experiments", "run", name, "--quick", "--out", str(out))
    assert code == 0, cap.err
    report = (out / "report.md").read_text()
    assert "**Claim.**" in report and "**Measured.**" in report and "**Verdict.**" in report
    pngs = list(out.glob("*.png"))
    assert pngs and all(p.stat().st_size > 5000 for p in pngs)
    if name == "ring-traffic":
        # byte counts are exact: this claim holds in any run
        assert "The claim **holds**" in report
