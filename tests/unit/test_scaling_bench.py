"""bench/scaling.py's bookkeeping, in-process: a measurement that fails (the first GPU
check's 15 Hogwild! workers diverged) is reported as failed with its one line and the
others are kept; the last line stays one JSON object; the exit status says so. The
measurements themselves are replaced by fixed rates here (the benchmark's runs take
minutes); Hogwild!'s learning rate is the bench's own."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from phalanx.runtime.launch import WorkerFailed

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def scaling(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # its `import _common`
    found = importlib.util.spec_from_file_location("bench_scaling", BENCH / "scaling.py")
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    monkeypatch.setattr(module, "load_data", lambda *a, **k: None)
    monkeypatch.setattr(module, "cores", lambda: 16)
    return module


RATES = {"single": 1000.0, "ddp": 1800.0, "sync_ring": 1700.0, "sync_native": 1900.0}


def fake(fail: set[tuple[str, int]]):
    def measure(name, n, steps, device, data):
        if (name, n) in fail:
            raise WorkerFailed("worker 9 failed: Diverged: training diverged: the training "
                               "loss is nan at step 10\n(more)")
        return RATES.get(name, 1500.0) * (1 if name == "single" else n / 2)
    return measure


def run(scaling, capsys, fail, argv):
    scaling.measure = fake(fail)
    rc = scaling.main(argv)
    lines = capsys.readouterr().out.strip().splitlines()
    return rc, lines, json.loads(lines[-1])


def test_a_failed_measurement_is_reported_and_the_others_kept(scaling, capsys):
    rc, lines, out = run(scaling, capsys, {("hogwild", 15)},
                         ["--max-workers", "15", "--worker-counts", "8,15"])
    assert rc == 1
    assert set(out) == {"bench", "results", "ratios", "targets", "met"}
    results, ratios = out["results"], out["ratios"]
    assert results["failed"] == {"hogwild_N15": "WorkerFailed: worker 9 failed: Diverged: "
                                 "training diverged: the training loss is nan at step 10"}
    assert "N=15 hogwild: FAILED: WorkerFailed: " in "\n".join(lines)
    assert "FAILED: hogwild_N15" in results["note"]
    # everything else measured, N = 15 included: the run went on past the failure
    assert results["samples_per_s"]["hogwild"] == {"N8": 6000.0}
    assert results["samples_per_s"]["average_k8"] == {"N8": 6000.0, "N15": 11250.0}
    assert "hogwild_efficiency_N15" not in ratios
    assert ratios["hogwild_efficiency_N8"] == round(6000 / (8 * 1000), 3)
    assert ratios["sync_ring_over_ddp_N15"] == round(1700 / 1800, 3)
    assert out["met"]["sync_native_over_ddp_N8"] is True  # 1900 / 1800


def test_a_failed_reference_leaves_its_ratios_unmet_and_says_why(scaling, capsys):
    rc, _, out = run(scaling, capsys, {("ddp", 2)}, ["--quick"])
    assert rc == 1 and out["results"]["failed"].keys() == {"ddp_N2"}
    assert "sync_ring_over_ddp_N2" not in out["ratios"]
    assert out["met"]["sync_ring_over_ddp_N2"] is False  # a target never silently dropped
    assert any(k.startswith("sync_ring_over_ddp_N2 (a measurement failed: ddp_N2")
               for k in out["results"]["not_measured"])


def test_nothing_failed_exits_0(scaling, capsys):
    rc, _, out = run(scaling, capsys, set(), ["--quick"])
    assert rc == 0 and out["results"]["failed"] == {} and out["results"]["note"] == ""
    assert out["results"]["single_samples_per_s"] == 1000.0


def test_hogwild_lr_divides_by_the_staleness_of_n_writers(scaling):
    assert scaling.hogwild_lr(1) == scaling.hogwild_lr(2) == 0.05
    assert scaling.hogwild_lr(8) == pytest.approx(0.05 / 7)
    assert scaling.hogwild_lr(15) == pytest.approx(0.05 / 14)
    cfg = scaling.config("/tmp/x", "hogwild", 15, 160, "cpu", strategy="hogwild")
    assert cfg.lr == pytest.approx(0.05 / 14) and cfg.rule == "sgd"
    assert scaling.config("/tmp/x", "sync_ring", 15, 160, "cpu", strategy="sync").lr == 0.05
