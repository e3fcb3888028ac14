"""``phalanx interference profile --levels link`` (issue 49): two sync jobs across two test
hosts whose link is shaped to 20 Mbit/s halve each other (their steps are ~98% link), and
the hosts are gone after. Its flags are checked in one line each (fast)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.cluster.model.interference import load_table
from phalanx.cluster.studies.interference import ProfileOptions
from phalanx.errors import ConfigError
from phalanx.runtime.hosts import unavailable

REPO = Path(__file__).resolve().parents[2]


def test_link_options_default_to_the_classes_that_span_hosts_and_check_the_rate() -> None:
    opts = ProfileOptions.parse(classes="", pairs="", levels="link")
    assert opts.classes == ("mlp-single-1", "mlp-sync-2", "ctr-ps-1", "gpt-sync-2")
    assert opts.link_rate == 20.0
    assert "gpt-sync-2" not in ProfileOptions.parse(classes="", pairs="",
                                                    levels="core,server").classes
    for rate in (0.0, -1.0, float("nan"), 1e6):
        with pytest.raises(ConfigError, match=r"^--link-rate must be in \(0, 100000\] Mbit/s"):
            ProfileOptions.parse(classes="", pairs="", levels="link", link_rate=rate)


def test_a_link_rate_without_the_link_level_is_one_line(tmp_path, capsys) -> None:
    from phalanx.cli import main

    assert main(["interference", "profile", "--levels", "core", "--link-rate", "50",
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--link-rate: only level link uses it" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
@pytest.mark.skipif(unavailable() is not None, reason=f"no test hosts: {unavailable()}")
def test_two_sync_jobs_on_one_shaped_link_keep_about_half_each(tmp_path) -> None:
    """Measured once, 3 s: mlp-sync-2 alone across the hosts, then two of them (~30 s). On
    20 Mbit/s a step's allreduce takes ~0.15 s against ~1 ms of compute: sharing the link
    halves each (0.3-0.7, a sum of 0.7-1.3)."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "phalanx", "interference", "profile",
                             "--levels", "link", "--pairs", "mlp-sync-2:mlp-sync-2",
                             "--classes", "mlp-sync-2", "--seconds", "3", "--repeats", "1",
                             "--warmup-steps", "10", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    (p,) = load_table(out / "interference.json").pairs
    assert (p.level, p.a, p.b) == ("link", "mlp-sync-2", "mlp-sync-2")
    assert 0.3 <= p.kept_a <= 0.7 and 0.3 <= p.kept_b <= 0.7, (p.kept_a, p.kept_b)
    info = load_table(out / "interference.json").classes["mlp-sync-2"]
    assert info["link_mbit"] == 20.0 and info["processes"] == 2 and info["solo_link"] > 0
    # the profiler's test hosts (named after its pid) are gone
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"phx-{proc.pid}-" not in names
