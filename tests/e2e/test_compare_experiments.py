"""`phalanx compare` and the quick version of every experiment, as a user runs them."""

import importlib
import inspect
import json

import pytest
from cli_run import run_main

from phalanx.experiments import EXPERIMENTS


def test_compare_writes_report_table_and_plots(tmp_path, capsys):
    out = tmp_path / "cmp"
    # 4,096 samples: 32 pushes per ASP worker (batch 64). Staleness needs the two workers'
    # pushes to interleave; with 8 each (1,024 samples) one worker once finished before
    # the other had started (a fresh-clone run, busy machine): staleness_max 0
    code, cap = run_main(capsys, "compare", "--strategies", "single,asp", "--workers", "2",
                         "--model", "mlp", "--data", "synthetic", "--epochs", "1",
                         "--train-limit", "4096", "--target-accuracy", "0.3",
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
    (["--strategies", "single", "--seeds", "0"], "--seeds: '0' is neither a count"),
    (["--strategies", "single", "--seeds", "1,x"], "--seeds: '1,x' is neither"),
    (["--strategies", "single", "--seeds", "2,2"], "--seeds: '2,2' must name distinct"),
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


def test_compare_over_seeds_reports_mean_sd_and_interval(tmp_path, capsys):
    out = tmp_path / "cmp"
    code, cap = run_main(capsys, "compare", "--strategies", "single", "--seeds", "3",
                         "--model", "mlp", "--data", "synthetic", "--epochs", "1",
                         "--train-limit", "512", "--target-accuracy", "0.3",
                         "--no-tensorboard", "--out", str(out))
    assert code == 0, cap.err
    results = json.loads((out / "results.json").read_text())[0]
    accs = [r["summary"]["test_accuracy"] for r in results["runs"]]
    assert results["seeds"] == [0, 1, 2] and len(set(accs)) > 1  # the seeds differ
    acc = results["test_accuracy"]
    assert acc["n"] == 3 and acc["mean"] == pytest.approx(sum(accs) / 3)
    assert acc["ci95"][0] < acc["mean"] < acc["ci95"][1]
    report = (out / "report.md").read_text()
    assert f"{acc['mean']:.4f} ± {acc['sd']:.4f}" in report
    assert f"[{acc['ci95'][0]:.4f}, {acc['ci95'][1]:.4f}]" in report
    assert "Verdict rule:" in report and "Test accuracy per seed" in report
    assert all((out / f"seed{s}" / "single" / "summary.json").is_file() for s in range(3))
    assert (out / "accuracy_vs_time.png").stat().st_size > 5000


def test_dc_asgd_over_seeds_writes_means_intervals_and_a_verdict(tmp_path, capsys):
    """The must-show path: ``experiments run dc-asgd --seeds K`` (quick, 2 seeds)."""
    out = tmp_path / "dc"
    code, cap = run_main(capsys, "experiments", "run", "dc-asgd", "--quick", "--seeds", "2",
                         "--out", str(out))
    assert code == 0, cap.err
    report = (out / "report.md").read_text()
    assert "Seeds: 0, 1 (2)" in report and "Verdict rule:" in report
    assert "test acc (mean ± sd) | 95% CI" in report
    verdict = report.split("**Verdict.**", 1)[1].split("\n", 1)[0]
    assert any(w in verdict for w in ("**holds**", "**does not hold here**",
                                      "**inconclusive**"))
    # every comparison names the test that decided it
    assert report.count("- N=2, DC-ASGD") == 2
    assert "paired t-test" in report or "intervals apart" in report
    results = json.loads((out / "results.json").read_text())
    assert {r["label"] for r in results} >= {"ASGD N=2", "SSGD N=2", "DC-ASGD-a λ=2 N=2"}
    assert all(r["test_accuracy"]["n"] == 2 and None not in r["test_accuracy"]["ci95"]
               for r in results)
    # --reuse reads the finished runs back instead of training again
    code, cap = run_main(capsys, "experiments", "run", "dc-asgd", "--quick", "--seeds", "2",
                         "--reuse", "--out", str(out))
    assert code == 0 and "test accuracy" not in cap.err  # no run was trained


# the GPT studies beside gpt-strategies: their verdicts are tested on made-up seeds
# (tests/unit/test_gpt_studies.py); their quick runs (~18 s together) run with -m slow.
# So does bandwidth's (8 torchrun groups on test hosts: ~30 s quiet, ~50 s at CI's load, the
# suite's longest test but one); its report and verdicts: tests/unit/test_bandwidth_study.py,
# and what it rests on (tbf's cap, the kernel's byte counts, ring bytes across hosts):
# tests/multinode/test_hosts.py, test_wire_bytes.py
SLOW_QUICK = {"gpt-pipeline-bubble", "gpt-dc-asgd", "gpt-staleness", "gpt-compression",
              "gpt-memory",
              "bandwidth"}


# dc-asgd's quick run is covered over two seeds above
@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n in SLOW_QUICK else n
    for n in sorted(set(EXPERIMENTS) - {"dc-asgd"})])
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
    # a noisy study run on one seed says plainly that it cannot give a verdict
    seeded = "seeds" in inspect.signature(
        importlib.import_module(EXPERIMENTS[name][1]).run).parameters
    assert ("One seed cannot give a verdict" in report) == seeded, name


def test_compare_reuse_reads_finished_runs_back_and_gives_pairwise_verdicts(tmp_path, capsys):
    """compare --reuse (README): a second compare over the same folder trains nothing; with
    two seeds each pair of strategies gets a verdict on accuracy and on samples/s."""
    args = ["compare", "--strategies", "single,sync", "--workers", "2", "--data", "synthetic",
            "--model", "mlp", "--max-steps", "12", "--seeds", "2", "--no-tensorboard",
            "--out", str(tmp_path)]
    code, first = run_main(capsys, *args)
    assert code == 0, first.err
    assert "single > sync in" in first.out or "sync > single in" in first.out
    assert first.out.count("steady-state samples/s (") == 1  # one pair, one verdict each
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("summary.json")}
    code, again = run_main(capsys, *args, "--reuse")
    assert code == 0 and "test accuracy" not in again.err  # no run was trained
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("summary.json")} == before
