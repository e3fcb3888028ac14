"""``phalanx hosts up N`` / ``down`` (issue 27): test hosts that outlive the command, for
trying the multi-node commands of docs/multi-node.md by hand."""

from __future__ import annotations

import subprocess
import sys

import pytest

from phalanx.runtime.hosts import kept_hosts, unavailable

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")


def phalanx(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phalanx.cli", *args], capture_output=True,
                          text=True, timeout=60)


def test_hosts_up_reach_each_other_and_go_down():
    assert kept_hosts() == [], "kept test hosts are up already"
    try:
        r = phalanx("hosts", "up", "2")
        assert r.returncode == 0, r.stderr
        assert kept_hosts() == ["phxh-br", "phxh-h0", "phxh-h1"]
        # h0 reaches h1's address through the bridge (refused: nothing listens there)
        probe = ("import socket; s = socket.socket(); s.settimeout(5)\n"
                 "try:\n    s.connect(('10.231.250.2', 9))\nexcept ConnectionRefusedError:\n"
                 "    print('refused')")
        out = subprocess.run(["ip", "netns", "exec", "phxh-h0", sys.executable, "-c", probe],
                             capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == "refused", out.stderr
        again = phalanx("hosts", "up", "2")
        assert again.returncode == 2 and again.stderr.startswith("phalanx: error: test hosts")
    finally:
        r = phalanx("hosts", "down")
    assert r.returncode == 0 and "removed 3 namespace(s)" in r.stdout
    assert kept_hosts() == []
