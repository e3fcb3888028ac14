"""One latency (alpha) for every calibrated rate, from gloo's messages that fit in every
token bucket, and ``phalanx scale calibrate --refit`` fitting an earlier calibration's
measurements again without test hosts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_run import run_main

from phalanx.scale import calibrate as cal

GLOO = Path(__file__).resolve().parents[2] / "reports/experiments/scale/calibration-gloo.json"


def _rate(rate: float, alpha: float, gloo: list[tuple[int, float]]) -> dict:
    """Raw-socket points on the line alpha + bytes / rate past a 100 KB bucket, and gloo
    points as given."""
    bw = rate * 1e6 / 8
    pts = [{"bytes": b, "seconds": alpha + max(0, b - 100_000) / bw}
           for b in (16384, 65536, 262144, 1048576, 4194304) for _ in range(2)]
    return {"rate_mbit": rate, "points": pts, "duplex_points": pts,
            "gloo_points": [{"bytes": b, "seconds": t} for b, t in gloo],
            "gloo_duplex_points": [{"bytes": b, "seconds": t} for b, t in gloo],
            "wire_bytes_per_payload_byte": 1.0, "ack_bytes_per_payload_byte": 0.0}


def test_one_alpha_is_the_median_of_gloo_messages_inside_every_bucket():
    # intercepts of 2 ms and 0 ms per rate; gloo's small messages say 0.5-0.9 ms; the
    # 1 MB gloo message is past the buckets and left out
    measured = {"100": _rate(100, 0.002, [(16384, 0.0005), (65536, 0.0009), (1048576, 0.1)]),
                "20": _rate(20, 0.0, [(16384, 0.0007), (65536, 0.0006), (1048576, 0.4)])}
    fitted = cal.fit(measured)
    assert fitted["100"]["alpha_fit_s"] == pytest.approx(0.002, abs=3e-4)
    assert fitted["20"]["alpha_fit_s"] == pytest.approx(0.0, abs=3e-4)
    for v in fitted.values():
        assert v["alpha_s"] == pytest.approx(0.00065)  # median of 0.5, 0.6, 0.7, 0.9 ms
        assert v["alpha_from"].startswith("gloo")
    # without gloo points (calibrations before 2026-11-29) each rate keeps its intercept
    for m in measured.values():
        m["gloo_points"] = m["gloo_duplex_points"] = []
    old = cal.fit(measured)
    assert old["100"]["alpha_s"] == pytest.approx(0.002, abs=3e-4)


def test_refit_fits_a_saved_calibration_again(capsys, tmp_path):
    out = tmp_path / "refit.json"
    rc, (text, err) = run_main(capsys, "scale", "calibrate", "--refit", str(GLOO),
                               "--out", str(out))
    assert rc == 0, err
    old, new = json.loads(GLOO.read_text()), json.loads(out.read_text())
    assert new["measured"] == old["measured"] and new["server"] == old["server"]
    assert new["refit_of"] == str(GLOO)
    assert new["measured_on"] == old.get("measured_on", old["date"])  # when measured
    alphas = {v["alpha_s"] for v in new["fitted"].values()}
    assert len(alphas) == 1 and 0.0002 < alphas.pop() < 0.002
    for k, v in new["fitted"].items():  # the bandwidths are the saved fit's
        assert v["beta_s_per_byte"] == pytest.approx(old["fitted"][k]["beta_s_per_byte"])
    assert "| 20 |" in text


@pytest.mark.parametrize("content, text", [
    (None, "--calibration {p}: cannot read"),
    ('{"fitted": {"20": {"alpha_s": 0, "efficiency": 1}}}', "--refit {p}: holds no "
                                                          "measurements to fit"),
    ('{"fitted": {"20": {"alpha_s": 0, "efficiency": 1}}, "measured": {"20": {"x": 1}}}',
     "--refit {p}: its measurements are not those of 'phalanx scale calibrate'"),
])
def test_refit_bad_input_is_one_line(capsys, tmp_path, content, text):
    p = tmp_path / "c.json"
    if content is not None:
        p.write_text(content)
    out = tmp_path / "o.json"
    rc, (_, err) = run_main(capsys, "scale", "calibrate", "--refit", str(p), "--out", str(out))
    assert rc == 2 and text.format(p=p) in err and err.count("\n") == 1, err
    assert not out.exists()


def test_the_fan_out_probe_is_fitted_per_size_and_reaches_the_link():
    """first / last = 0.5 (two sends one after the other) -> share 1; 1 -> 0 (shared);
    0.9 -> 0.2; sorted by size, clamped to [0, 1]; ``link_for`` hands it to the link (a
    calibration without the probe: none, the fluid sharing)."""
    measured = {"100": _rate(100, 0.001, [(16384, 0.0008), (1048576, 0.09)])}
    measured["100"]["fanout_points"] = [
        {"bytes": 4 << 20, "first_over_last": 0.9}, {"bytes": 256 << 10, "first_over_last": 0.5},
        {"bytes": 1 << 20, "first_over_last": 1.1}, {"bytes": 64 << 10, "first_over_last": 0.3}]
    fitted = cal.fit(measured)
    want = [(64 << 10, 1.0), (256 << 10, 1.0), (1 << 20, 0.0), (4 << 20, 0.2)]
    assert [b for b, _ in fitted["100"]["fanout"]] == [b for b, _ in want]
    assert [x for _, x in fitted["100"]["fanout"]] == pytest.approx([x for _, x in want])
    link = cal.link_for(fitted, 100)
    assert [b for b, _ in link.fanout] == [b for b, _ in want]
    assert [x for _, x in link.fanout] == pytest.approx([x for _, x in want])
    assert link.in_turn(512 << 10) == pytest.approx(0.5)  # log-midway 256 KB - 1 MB
    del measured["100"]["fanout_points"]
    assert cal.link_for(cal.fit(measured), 100).fanout == ()
