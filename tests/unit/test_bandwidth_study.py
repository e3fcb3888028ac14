"""The bandwidth study's report and verdicts on made-up measurements (no test hosts, no
training). Its quick run on real test hosts (~30 s quiet, ~50 s at CI's load) is in
tests/e2e/test_compare_experiments.py, marked slow."""

from __future__ import annotations

import pytest

from phalanx.experiments.bandwidth import STRATEGIES, Measured, Setting, report

X = 1_000_000.0   # a ring worker's bytes per step at N = 2


def _made_up(s: Setting, *, ring_flat: bool, avg_gains_on_slow: bool,
             asp_gains_on_slow: bool) -> list[Measured]:
    fast, slow = max(s.rates), min(s.rates)
    out = []
    for n in s.sizes:
        for rate in s.rates:
            for st in STRATEGIES:
                world = n + 2 if st == "asp" else n
                ring_tx = 2 * (n - 1) / n * X if ring_flat else (n - 1) * X
                tx = {"ring": ring_tx, "main": (n - 1) * X, "average": X / 8,
                      "asp": X}[st]
                tx_per = {r: (tx if (st != "main" or r == 0) else X) for r in range(world)}
                speed = 100.0
                if st == "average":
                    speed *= 3.0 if (rate == slow and avg_gains_on_slow) else 1.2
                if st == "asp":
                    speed *= 1.5 if (rate == slow and asp_gains_on_slow) else 1.1
                out.append(Measured(st, n, rate, speed, 10.0 if rate == fast else None, 0.6,
                                    tx_per, dict(tx_per)))
    return out


def _verdicts(text: str) -> list[str]:
    return [ln.split("The claim ", 1)[1] for ln in text.splitlines()
            if ln.startswith("**Verdict.**")]


@pytest.mark.parametrize("ring_flat", [True, False])
def test_three_claims_follow_the_measurements(tmp_path, ring_flat):
    s = Setting(False, (2, 3, 4), (1000.0, 100.0, 20.0), 60, 0.7, "synthetic")
    results = _made_up(s, ring_flat=ring_flat, avg_gains_on_slow=True,
                       asp_gains_on_slow=False)
    text = report(tmp_path, results, s, seed=0).read_text()
    assert _verdicts(text) == ["**holds**." if ring_flat else "**does not hold here**.",
                               "**holds**.", "**does not hold here**."]
    # the figures the verdicts rest on are in the text: ring 1.00, 1.33, 1.50 MB (x1.50)
    if ring_flat:
        assert "ring's busiest worker 1.00, 1.33, 1.50 MB (x1.50" in text
        assert "main node's root 1.00, 2.00, 3.00 MB (x3.00)" in text
    assert "average / sync ring samples/s at N=4: x1.20 at 1000 Mbit/s, x3.00 at 20 Mbit/s" \
        in text
    assert {p.name for p in tmp_path.glob("*.png")} == {
        "throughput.png", "time_to_target.png", "traffic_vs_n.png"}
    # one row per (N, link, strategy), and an unreached target says so
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and "Mbit/s |" in ln]
    assert len(rows) == 3 * 3 * 4
    assert sum("not reached" in ln for ln in rows) == 2 * 3 * 4


def test_one_size_cannot_judge_traffic_against_n(tmp_path):
    """The quick setting runs N = 2 only: the traffic claim is inconclusive, not a verdict."""
    s = Setting(True, (2,), (100.0, 20.0), 8, 0.5, "synthetic")
    results = _made_up(s, ring_flat=True, avg_gains_on_slow=False, asp_gains_on_slow=True)
    text = report(tmp_path, results, s, seed=1).read_text()
    assert _verdicts(text) == ["is **inconclusive**.", "**does not hold here**.",
                               "**holds**."]
    assert "phalanx experiments run bandwidth --quick" in text
