"""The Ray engine's inputs that used to hang or crash (issue 33's appendix): an address
where nothing listens is one line within seconds (Ray retried it for minutes), and a long
TMPDIR no longer breaks Ray's socket paths (AF_UNIX holds 107 bytes)."""

from __future__ import annotations

import dataclasses
import socket
import tempfile
import time

import pytest

from phalanx.cli import main
from phalanx.cluster.live.engines import ray_cluster as R
from phalanx.errors import ConfigError
from phalanx.runtime import signals
from phalanx.runtime.signals import AF_UNIX_MAX


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
    assert len(R.ray_temp_root() + name + "plasma_store") <= AF_UNIX_MAX
    # neither the long TMPDIR nor a /tmp it may not write: one line naming TMPDIR
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    monkeypatch.setattr(signals.os, "access", lambda path, mode: False)
    with pytest.raises(ConfigError) as e:
        R.ray_temp_root()
    assert str(e.value).startswith(f"TMPDIR {long}: too long for Ray's socket paths (107 "
                                   "bytes at most; give a temp folder of at most ")


def test_each_device_resource_carries_its_type_and_a_mismatch_is_one_line():
    """A node declares ``phx_type_<type>`` beside its ``phx_dev_<id>`` resources (the
    local cluster builds its nodes so); the executor checks every server's node against
    the topology's types (here on the node records ``ray.nodes()`` gives)."""
    from phalanx.cluster.core.cluster_file import topology_from_mapping
    from phalanx.cluster.core.topology import Topology

    topo = topology_from_mapping({"name": "two", "device_types": [
        {"name": "fast"}, {"name": "slow", "slowdown": 3}], "zones": [{"name": "z", "racks": [
            {"name": "r", "servers": [
                {"name": "f", "device_type": "fast", "devices": 2, "cpu_cores": 2},
                {"name": "s", "device_type": "slow", "devices": 1, "cpu_cores": 2}]}]}]})
    nodes = [R.node_resources(topo, 0), R.node_resources(topo, 1)]
    assert nodes == [{"phx_dev_0": 1.0, "phx_dev_1": 1.0, "phx_type_fast": 2.0},
                     {"phx_dev_2": 1.0, "phx_type_slow": 1.0}]
    assert R.type_mismatch(topo, nodes) == ""
    swapped = [{**nodes[0], "phx_type_fast": 0, "phx_type_slow": 2.0}, nodes[1]]
    del swapped[0]["phx_type_fast"]
    assert R.type_mismatch(topo, swapped) == (
        "server f (phx_dev_0, phx_dev_1) is on a node that declares type(s) slow, but "
        "--cluster two says fast (ray start --resources '{\"phx_type_fast\": 2, ...}')")
    untyped = [{k: v for k, v in n.items() if not k.startswith("phx_type_")} for n in nodes]
    assert "server f (phx_dev_0, phx_dev_1) is on a node that declares no type" in (
        R.type_mismatch(topo, untyped))
    # a cluster of one type accepts nodes started before types were declared
    one = Topology("one", [topo.device_types["fast"]], topo.zones, topo.racks,
                   [dataclasses.replace(s, device_type="fast") for s in topo.servers])
    assert R.type_mismatch(one, untyped) == ""
