"""The gradient noise scale (McCandlish et al. 2018's two-batch estimator) and the probe a
sync job uses to report its step times and noise to a scheduler."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from phalanx.metrics.noise import NoiseScale, two_batch_estimate

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_batch_estimate_recovers_known_gradient_and_noise(seed):
    """Per-sample gradients G + sigma * N(0, I) in d dims: |G|^2 and S = d sigma^2 are
    known. The estimates are unbiased: their means land within 5% (a sum for a mean, or the
    batch sizes swapped, misses by 2x or more); the moving average follows them."""
    g = torch.Generator().manual_seed(seed)
    d, sigma = 40, 1.5
    G = torch.randn(d, generator=g)
    ema = NoiseScale(decay=0.99)
    sums = [0.0, 0.0]
    n = 4000
    for _ in range(n):
        per = G + sigma * torch.randn(96, d, generator=g)
        small, big = per[:32].mean(0), per.mean(0)
        g2, s = two_batch_estimate(float(small.pow(2).sum()), float(big.pow(2).sum()), 32, 96)
        sums[0] += g2 / n
        sums[1] += s / n
        ema.add(g2, s)
    assert sums[0] == pytest.approx(float(G.pow(2).sum()), rel=0.05)
    assert sums[1] == pytest.approx(d * sigma ** 2, rel=0.05)
    assert ema.g2 == pytest.approx(sums[0], rel=0.3) and ema.s == pytest.approx(sums[1], rel=0.3)
    assert ema.b_noise == pytest.approx(ema.s / ema.g2)


def test_two_batch_estimate_edges():
    assert two_batch_estimate(3.0, 2.0, 1, 2) == (1.0, 2.0)   # |G|^2 = 2*2-3, S = 1/(1-.5)
    with pytest.raises(ValueError):
        two_batch_estimate(1.0, 1.0, 4, 4)
    assert math.isnan(NoiseScale().b_noise)


def test_sync_rank0_reports_step_times_and_noise(tmp_path):
    out = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "phalanx.cli", "train", "--strategy", "sync",
                    "--workers", "2", "--model", "mlp", "--data", "synthetic", "--max-steps",
                    "60", "--epochs", "5", "--threads", "1", "--no-progress", "--out",
                    str(out)], check=True, cwd=REPO, capture_output=True, timeout=120)
    events = [json.loads(ln) for ln in (out / "events.jsonl").read_text().splitlines()]
    perf = [e for e in events if e["kind"] == "perf"]
    noise = [e for e in events if e["kind"] == "noise"]
    # one window per 10 steps after the first (warm-up) window, from rank 0 only
    assert [e["step"] for e in perf] == [20, 30, 40, 50, 60]
    assert all(e["rank"] == 0 and e["workers"] == 2 and e["batch"] == 64 for e in perf)
    assert all(e["step_s"] > e["sync_s"] >= 0 for e in perf)
    assert [e["step"] for e in noise] == [10, 20, 30, 40, 50, 60]
    assert all(e["b_small"] == 64 and e["b_big"] == 128 and e["s"] > 0 for e in noise)
