"""The Slurm engine's parts that need no Slurm: how a job's end is read, the batch script
(run for real, with the environment Slurm would give it), the local cluster's
configuration."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.cli import main
from phalanx.cluster.core.cluster_file import topology_from_mapping
from phalanx.cluster.core.topology import uniform
from phalanx.cluster.live.engines.base import KILLED
from phalanx.cluster.live.engines.slurm.conf import (
    LocalPorts,
    gres_lines,
    gres_request,
    gres_type,
    local_conf,
)
from phalanx.cluster.live.engines.slurm.executor import batch_script, decode
from phalanx.errors import ConfigError
from phalanx.runtime.preempt import PREEMPTED_EXIT


@pytest.mark.parametrize("state, status, code", [
    ("COMPLETED", 0, 0),
    ("FAILED", PREEMPTED_EXIT << 8, PREEMPTED_EXIT),   # checkpointed on SIGTERM
    ("FAILED", 2 << 8, 2),
    ("FAILED", 9, KILLED),                               # SIGKILL after the grace period
    ("CANCELLED", 0, KILLED),                            # cancelled while pending
    ("NODE_FAIL", 0, 1),                                 # Slurm ended it: never a success
    ("TIMEOUT", 15, -15),
])
def test_a_jobs_end_reads_as_popen_does(state, status, code):
    assert decode(state, status) == code


PROBE = ("import os, json; sig = int([l for l in open('/proc/self/status') if "
         "l.startswith('SigBlk')][0].split()[1], 16); print(json.dumps({k: os.environ.get(k) "
         "for k in ('CUDA_VISIBLE_DEVICES', 'PHALANX_NODE', 'RANK')} | "
         "{'term_blocked': bool(sig & (1 << 14)), 'cwd': os.getcwd()}))")


def _run_task(tmp_path: Path, local: list[int], slurm_env: dict[str, str], hold: bool = True):
    spec = {"job": "A", "rank": 1, "local": local, "env": {"RANK": "1"}, "cwd": str(tmp_path),
            "hold_term": hold, "python": sys.executable, "argv": ["-c", PROBE]}
    script = tmp_path / "batch"
    script.write_text(batch_script(sys.executable, spec))
    script.chmod(0o755)
    return subprocess.run([str(script)], env={"PATH": "/usr/bin:/bin", **slurm_env},
                          capture_output=True, text=True, timeout=60, check=False)


def test_batch_script_pins_what_slurm_gave(tmp_path):
    """Slurm gave index 1 on node b (the rank's device 1 there): the rank sees device 1,
    records node b, starts with SIGTERM blocked, in the scheduler's folder."""
    r = _run_task(tmp_path, [1], {"SLURM_JOB_GPUS": "1", "CUDA_VISIBLE_DEVICES": "1",
                                  "SLURMD_NODENAME": "b"})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"CUDA_VISIBLE_DEVICES": "1", "PHALANX_NODE": "b",
                                    "RANK": "1", "term_blocked": True, "cwd": str(tmp_path)}
    r = _run_task(tmp_path, [1], {"SLURM_JOB_GPUS": "1", "SLURMD_NODENAME": "b"}, hold=False)
    assert json.loads(r.stdout)["term_blocked"] is False


def test_batch_script_refuses_other_devices(tmp_path):
    r = _run_task(tmp_path, [1], {"SLURM_JOB_GPUS": "0", "SLURMD_NODENAME": "b"})
    assert r.returncode == 3 and r.stdout == ""
    assert r.stderr == ("phalanx: error: rank 1 of A: Slurm gave devices [0] on node b, the "
                        "scheduler chose [1]\n")


def test_batch_script_keeps_a_confining_clusters_numbers(tmp_path):
    """ConstrainDevices=yes: the job sees only its device, which Slurm numbers 0."""
    r = _run_task(tmp_path, [3], {"SLURM_JOB_GPUS": "3", "CUDA_VISIBLE_DEVICES": "0",
                                  "SLURMD_NODENAME": "b"})
    assert json.loads(r.stdout)["CUDA_VISIBLE_DEVICES"] == "0"


def test_local_conf_binds_loopback_and_types_every_device(tmp_path):
    t = uniform(1, 1, 2, 2, 1)
    conf = local_conf(t, tmp_path, LocalPorts(7000, (7001, 7002)))
    assert "SlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=7000\n" in conf
    assert "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny\n" in conf
    nodes = [ln for ln in conf.splitlines() if ln.startswith("NodeName=")]
    assert nodes == [
        "NodeName=z0-r0-s0 NodeHostname=localhost NodeAddr=127.0.0.1 Port=7001 CPUs=32 "
        "Gres=gpu:phx0:1,gpu:phx1:1 State=UNKNOWN",
        "NodeName=z0-r0-s1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=7002 CPUs=32 "
        "Gres=gpu:phx2:1,gpu:phx3:1 State=UNKNOWN"]
    # every file a daemon writes is in the folder
    assert all(str(tmp_path) in ln for ln in conf.splitlines()
               if "=/" in ln and "Mail" not in ln)
    assert gres_lines(t, tmp_path)[2:] == [
        f"NodeName=z0-r0-s1 Name=gpu Type=phx2 File={tmp_path}/nvidia2",
        f"NodeName=z0-r0-s1 Name=gpu Type=phx3 File={tmp_path}/nvidia3"]
    assert gres_request(t, (2, 3)) == "gpu:phx2:1,gpu:phx3:1"


def two_types(slow: str = "t4") -> dict:
    """Two servers: s0 with 2 fast devices, s1 with 1 of type ``slow``."""
    return {"name": "two-types", "device_types": [
        {"name": "a100", "speed": 2.0}, {"name": slow, "speed": 0.5}],
        "zones": [{"name": "z", "racks": [{"name": "r", "servers": [
            {"name": "s0", "device_type": "a100", "devices": 2, "cpu_cores": 4},
            {"name": "s1", "device_type": slow, "devices": 1, "cpu_cores": 4}]}]}]}


def test_on_several_device_types_the_gres_type_is_the_gpu_type(tmp_path):
    """Issue 35: a device's GRES type starts with its GPU type, so the cluster's own
    declaration says which type a device is (and the executor checks it)."""
    t = topology_from_mapping(two_types())
    conf = local_conf(t, tmp_path, LocalPorts(7000, (7001, 7002)))
    gres = [ln.split("Gres=")[1].split()[0] for ln in conf.splitlines()
            if ln.startswith("NodeName=")]
    assert gres == ["gpu:a100_phx0:1,gpu:a100_phx1:1", "gpu:t4_phx2:1"]
    assert gres_lines(t, tmp_path)[2] == \
        f"NodeName=s1 Name=gpu Type=t4_phx2 File={tmp_path}/nvidia2"
    assert gres_request(t, (0, 1)) == "gpu:a100_phx0:1,gpu:a100_phx1:1"
    # a type name Slurm cannot carry in a GRES type is one line, naming it
    bad = topology_from_mapping(two_types("t4:x"))
    with pytest.raises(ConfigError, match="device type 't4:x' cannot name a Slurm GRES type"):
        gres_type(bad, 2)


def test_local_conf_on_test_hosts_names_each_daemon_by_its_host_address(tmp_path):
    """On test hosts slurmctld is host 0's address and each node's host name and address
    are its host's (each daemon binds what its host name resolves to: NoInAddrAny)."""
    t = uniform(1, 1, 2, 1, 1)
    conf = local_conf(t, tmp_path, LocalPorts(7000, (7001, 7002), ("10.9.8.1", "10.9.8.2")))
    assert "SlurmctldHost=10.9.8.1\nSlurmctldPort=7000\n" in conf
    assert "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny\n" in conf
    nodes = [ln.split(" CPUs")[0] for ln in conf.splitlines() if ln.startswith("NodeName=")]
    assert nodes == ["NodeName=z0-r0-s0 NodeHostname=10.9.8.1 NodeAddr=10.9.8.1 Port=7001",
                     "NodeName=z0-r0-s1 NodeHostname=10.9.8.2 NodeAddr=10.9.8.2 Port=7002"]


JOBS = "jobs:\n  - {name: A, arrival: 0, gpus: 1, config: {model: mlp, data: synthetic}}\n"


def test_without_slurm_one_line_error(tmp_path, monkeypatch, capsys):
    """No Slurm on the PATH: one line naming what to install, exit 2, no cluster folder."""
    (tmp_path / "jobs.yaml").write_text(JOBS)
    before = set(Path("/tmp").glob("phalanx-slurm-*"))
    monkeypatch.setenv("PATH", str(tmp_path))
    rc = main(["schedule", "--jobs", str(tmp_path / "jobs.yaml"), "--engine", "slurm",
               "--out", str(tmp_path / "out")])
    assert rc == 2
    assert capsys.readouterr().err == (
        "phalanx: error: --engine slurm needs Slurm: install slurm-wlm and munge "
        "(apt-get install slurm-wlm munge)\n")
    assert set(Path("/tmp").glob("phalanx-slurm-*")) == before


def test_slurm_partition_only_with_the_slurm_engine(tmp_path, capsys):
    (tmp_path / "jobs.yaml").write_text(JOBS)
    rc = main(["schedule", "--jobs", str(tmp_path / "jobs.yaml"), "--slurm-partition", "gpu",
               "--out", str(tmp_path / "out")])
    assert (rc, capsys.readouterr().err) == (
        2, "phalanx: error: --slurm-partition: only with --engine slurm\n")
