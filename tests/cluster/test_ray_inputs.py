"""The Ray engine's inputs that used to hang or crash (issue 33's appendix): an address
where nothing listens is one line within seconds (Ray retried it for minutes), and a long
TMPDIR no longer breaks Ray's socket paths (AF_UNIX holds 107 bytes)."""

from __future__ import annotations

import socket
import tempfile
import time

import pytest

from phalanx.cli import main
from phalanx.cluster.live.engines import ray as R
from phalanx.errors import ConfigError


def test_an_address_where_nothing_listens_is_one_line_at_once(tmp_path, capsys):
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        jobs = tmp_path / "jobs.yaml"
        jobs.write_text("jobs:\n  - {name: a, arrival: 0, gpus: 1, config: {model: mlp, "
                        "data: synthetic}}\n")
        t0 = time.monotonic()
        code = main(["schedule", "--jobs", str(jobs), "--cluster", "uniform:1,1,1,2",
                     "--engine", "ray", "--ray-address", f"127.0.0.1:{port}", "--out",
                     str(tmp_path / "out")])
    assert code == 2 and time.monotonic() - t0 < 10
    assert capsys.readouterr().err.strip().splitlines() == [
        f"phalanx: error: --ray-address 127.0.0.1:{port}: nothing answers there (connection "
        "refused); start the head with ray start --head"]


@pytest.mark.parametrize("address", ["127.0.0.1", ":6379", "host:0", "host:port", "h:70000"])
def test_a_malformed_address_is_refused(address):
    with pytest.raises(ConfigError) as e:
        R.check_address(address)
    assert str(e.value) == (f"--ray-address {address!r}: expected HOST:PORT of a Ray head "
                            "(ray start --head --port PORT)")


def test_the_local_cluster_leaves_a_long_tmpdir_for_tmp(tmp_path, monkeypatch):
    long = tmp_path / ("x" * 60)
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    assert R.ray_temp_root() == "/tmp"
    short = "/tmp"
    monkeypatch.setattr(tempfile, "tempdir", short)
    assert R.ray_temp_root() == short
    # the longest socket path Ray makes under the chosen root fits AF_UNIX
    name = "/phalanx-ray-abcdefgh/ray/session_2026-11-26_21-42-55_790123_1234567/sockets/"
    assert len(R.ray_temp_root() + name + "plasma_store") <= R.AF_UNIX_MAX
