"""A real external Ray cluster, started the way a user starts one (docs/cluster.md): ``ray
start --head`` on test host 0 and ``ray start --address`` on test host 1 (network
namespaces on one bridge, :class:`phalanx.runtime.hosts.TestNetwork`), each node declaring
its device (``--resources '{"phx_dev_N": 1}' --labels phalanx.server=NAME --num-gpus 0``);
``phalanx schedule --engine ray --ray-address HEAD:PORT`` runs inside host 0.

A 2-device sync gang spans both hosts: Ray reports each node's own address, rank 0 serves
the group's store there, and the job trains to the parameters of the same job on one host.
The ranks' listeners are on their host's own address only. (Ray's own daemons listen on
``*`` inside their namespace: recorded, not asserted; they are Ray's.)

The cluster is started once for the module and torn down on every exit path: our Ray
processes by their temp folder (never ``ray stop``: it would end every Ray process of the
machine), then the folders, then the namespaces.
"""

from __future__ import annotations

import csv
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from live_procs import pids_with  # noqa: E402

from phalanx.cluster.core.clusters import resolve_cluster  # noqa: E402
from phalanx.runtime import hosts  # noqa: E402
from phalanx.runtime.checkpoint import load_checkpoint  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
PORT = 6399
TOPOLOGY = "uniform:1,1,2,1"   # two servers of one device each: one Ray node per test host
SYNC = ("{model: mlp, data: synthetic, epochs: 100, strategy: sync, tensorboard: false, "
        "seed: 7, max_steps: 60, worker_threads: 1}")


def ray_env() -> dict[str, str]:
    """What every ``ray start`` and the scheduler get: no auth token (a ~/.ray/auth_token of
    this machine would make joining nodes fail with InvalidAuthToken), no usage stats, and
    this tree's phalanx for the actors and the ranks they start."""
    return {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONPATH": str(REPO)}


def _gone(marker: str, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pids_with(marker):
            return True
        time.sleep(0.2)
    return False


def _kill(marker: str) -> None:
    """SIGKILL the processes whose command line names ``marker`` (our temp folders)."""
    for pid in pids_with(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def external():
    why = hosts.unavailable()
    if why is not None:
        pytest.skip(f"no test hosts: {why}")
    if shutil.which("ip") is None or not Path(RAY).exists():
        pytest.skip("no ray command next to this Python")
    # short: Ray's AF_UNIX socket paths under it must fit in 107 bytes
    marker = f"/tmp/phxr{os.getpid() % 10**5}{random.randrange(10**4)}"
    temps = [f"{marker}-{i}" for i in range(2)]
    topology = resolve_cluster(TOPOLOGY, REPO)
    net = hosts.TestNetwork(2).__enter__()
    try:
        head = net.hosts[0].addr
        for i, host in enumerate(net.hosts):
            s = topology.servers[i]
            where = (["--head", "--port", str(PORT), "--include-dashboard", "false"] if i == 0
                     else ["--address", f"{head}:{PORT}"])
            r = host.run([RAY, "start", *where, "--node-ip-address", host.addr,
                          "--num-cpus", "2", "--num-gpus", "0",
                          "--resources", f'{{"phx_dev_{s.first_device}": 1}}',
                          "--labels", f"phalanx.server={s.name}", "--temp-dir", temps[i],
                          "--disable-usage-stats"],
                         env=ray_env(), timeout=120, check=False)
            assert r.returncode == 0, f"ray start on host {i}: {r.stdout[-2000:]}{r.stderr[-2000:]}"
        yield net, f"{head}:{PORT}", topology
    finally:
        _kill(marker)
        gone = _gone(marker)
        for t in temps:
            shutil.rmtree(t, ignore_errors=True)
        net.teardown()
    assert gone, "Ray processes of the test cluster were left behind"
    assert not any(Path(t).exists() for t in temps)


def test_a_gang_spanning_two_hosts_trains_like_one_host(external, tmp_path):
    net, address, topology = external
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"jobs:\n  - {{name: A, arrival: 0, gpus: 2, config: {SYNC}}}\n")
    out = tmp_path / "out"
    seen: dict[int, set] = {0: set(), 1: set()}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for i, host in enumerate(net.hosts):
                seen[i].update(host.listening())
            time.sleep(0.3)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        r = net.hosts[0].run([sys.executable, "-m", "phalanx.cli", "schedule", "--jobs",
                              str(jobs), "--cluster", TOPOLOGY, "--engine", "ray",
                              "--ray-address", address, "--out", str(out)],
                             env=ray_env(), cwd=REPO, timeout=240, check=False)
    finally:
        done.set()
        watcher.join()
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {row["name"]: row for row in csv.DictReader((out / "jobs.csv").open())}
    assert rows["A"]["status"] == "finished", rows["A"]

    # the same job on one host (local slots): the same parameters
    ref = tmp_path / "ref"
    subprocess.run([sys.executable, "-m", "phalanx.cli", "schedule", "--jobs", str(jobs),
                    "--cluster", "uniform:1,1,1,2", "--out", str(ref)], check=True,
                   env=ray_env(), cwd=REPO, capture_output=True, timeout=120)
    got = load_checkpoint(out / "jobs" / "A" / "checkpoint.pt")["model"]
    want = load_checkpoint(ref / "jobs" / "A" / "checkpoint.pt")["model"]
    assert got.keys() == want.keys() and got
    diff = max(float((got[k].float() - want[k].float()).abs().max()) for k in got)
    print(f"max |diff| two hosts vs one host: {diff:g}")
    assert diff <= 1e-6, diff

    # each rank ran on its host (the rank records say which node) and listened only on
    # its host's own address: rank 0's store and both gloo devices
    log = (out / "logs" / "A.log").read_text()
    ranks = {i: {(x.addr, x.port) for x in seen[i] if "phalanx.entry.scheduled" in x.cmdline}
             for i in seen}
    assert ranks[0] and ranks[1], (seen, log[-3000:])
    for i, host in enumerate(net.hosts):
        assert {a for a, _ in ranks[i]} == {host.addr}, (i, ranks[i])
    # Ray's own daemons: recorded for the report, not asserted (they are Ray's)
    ray_own = sorted({(i, x.addr) for i in seen for x in seen[i]
                      if "phalanx.entry.scheduled" not in x.cmdline})
    print(f"ray's own listeners (host, address): {ray_own}")
