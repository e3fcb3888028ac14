"""The calibration's fan-out probe with real processes on three test hosts at 100 Mbit/s:
the main node's allreduce back to back (phalanx/scale/fanout_probe.py). A message that
fits the link's token bucket (64 KB of 233 KB) leaves at line rate, so the first worker
has the sum well before the last; 1 MB, beyond the bucket, is nearer shared."""

from __future__ import annotations

from phalanx.scale.calibrate import fanout_probe, fit_fanout


def test_the_fan_out_probe_times_each_worker_s_sum_on_three_hosts(network) -> None:
    net = network(3, rate_mbit=100)
    got = fanout_probe(net, sizes=(64 << 10, 1 << 20), repeats=2)
    assert [p["bytes"] for p in got] == [64 << 10, 1 << 20]
    for p in got:
        assert len(p["ratios"]) == 2 and all(0 <= r <= 1.05 for r in p["ratios"]), p
    small, large = (p["first_over_last"] for p in got)
    assert small < large, got
    shares = fit_fanout(got)
    assert shares[0][1] >= shares[1][1] and all(0 <= x <= 1 for _, x in shares)
