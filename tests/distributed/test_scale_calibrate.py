"""``phalanx scale calibrate`` on real test hosts (root: network namespaces + tc tbf): the fit
must find the rate tbf was given and its burst, and the CLI writes a calibration file that
``--calibration`` then applies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phalanx.runtime.hosts import unavailable
from phalanx.scale import calibrate as cal
from phalanx.scale.network import Links, Network, gbit, uniform_network

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(unavailable() is not None,
                                 reason=f"test hosts unavailable: {unavailable()}")]


def test_fit_finds_the_shaped_rate_and_burst(tmp_path: Path) -> None:
    measured = cal.measure([50.0], repeats=2)
    fitted = cal.fit(measured)["50"]
    # TCP over tbf at 50 Mbit/s: the payload rate is 85-101% of the shaped rate
    assert 0.85 <= fitted["efficiency"] <= 1.01, fitted
    # tbf_args: a bucket of max(128 KiB, 20 ms of traffic) = 131,072 bytes at 50 Mbit/s
    assert 60_000 <= fitted["burst_bytes"] <= 260_000, fitted
    assert fitted["r2"] > 0.98 and 0 <= fitted["wire_overhead"] < 0.02
    path = tmp_path / "cal.json"
    cal.save(path, measured, {"50": fitted})
    data = json.loads(path.read_text())
    assert data["machine"] and data["date"]
    net = cal.apply(uniform_network(8, links=Links()), str(path))
    # the NIC (25 Gbit/s nominal) now carries the fitted efficiency and token bucket
    assert isinstance(net, Network)
    assert net.links.nic.bandwidth == pytest.approx(gbit(25) * fitted["efficiency"])
    assert net.links.nic.burst == fitted["burst_bytes"]
