"""Live scheduling on a real local Ray cluster (3 nodes in 2 racks, one device each):
Tiresias with a short quantum preempts and resumes real sync jobs on other nodes; every rank
records where it ran; nothing listens beyond 127.0.0.1; nothing is left after the run nor
after SIGINT mid-run.

The cluster is started once for the module (``ray_cluster``); ``phalanx schedule`` runs as
a user runs it, in its own process, against ``--ray-address``. The SIGINT test lets the CLI
build its own cluster, so the teardown of that path is checked too.
"""

import csv
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from live_procs import LOOPBACK, ranks_where_placed  # noqa: E402
from live_procs import listeners as _listeners  # noqa: E402
from live_procs import pids_with as _pids_with  # noqa: E402

from phalanx.cluster.core.clusters import resolve_cluster  # noqa: E402
from phalanx.cluster.live.engines.ray import ray_cluster  # noqa: E402
from phalanx.runtime import rank_record  # noqa: E402
from phalanx.runtime.checkpoint import load_checkpoint  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SYNC = "{model: mlp, data: synthetic, epochs: 100, strategy: sync, tensorboard: false, seed: 3"
# Tiresias, 6 s rounds, one threshold at 10 GPU-s, first-fit placement (lowest free
# devices). t=0: A (2 GPUs) on nodes a,b; C on c. t=1: B waits. Round 1 (t=6): A has 12
# GPU-s (queue 1), B and C are in queue 0: A is preempted, B takes a. t=7: Z, which cannot
# be preempted (model-parallel cannot resume), takes b for longer than B and C run (its
# steps take ~0.5 ms: 1000 of them, slowed 30x as a straggler, hold b for ~15 s): so A,
# whenever it comes back, can only come back on a and c. D, a second 2-node gang, arrives
# later. On a loaded machine
# start-up times shift the rounds, so the test asks for what must hold in any order: some
# job resumed on other nodes, and every rank where the scheduler put it.
JOBS = f"""jobs:
  - {{name: A, arrival: 0, gpus: 2, config: {SYNC}, max_steps: 1500}}}}
  - {{name: C, arrival: 0, gpus: 1, config: {SYNC}, max_steps: 5000}}}}
  - {{name: B, arrival: 1, gpus: 1, config: {SYNC}, max_steps: 3000}}}}
  - {{name: Z, arrival: 7, gpus: 1, config: {{model: mlp, data: synthetic, epochs: 100,
      strategy: model-parallel, tensorboard: false, max_steps: 1000,
      slow_workers: '0:30'}}}}
  - {{name: D, arrival: 20, gpus: 2, config: {SYNC}, max_steps: 300}}}}
"""
SCHEDULE = ["--policy", "tiresias", "--slot", "6", "--tiresias-thresholds", "10",
            "--starvation", "0", "--placement", "first-fit", "--grace", "30", "--engine",
            "ray"]


def _env():
    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    topo_path = "three-nodes"      # clusters.three_nodes: a | b, c in 2 racks
    topology = resolve_cluster(topo_path, REPO)
    before = set(Path(p).name for p in Path("/tmp").glob("phalanx-ray-*"))
    with ray_cluster(topology) as address:
        tmp = [p for p in Path("/tmp").glob("phalanx-ray-*") if p.name not in before]
        yield address, topo_path, topology, tmp[0]
    assert not tmp[0].exists(), "Ray's temp folder was left behind"
    assert not _pids_with(str(tmp[0])), "Ray processes were left behind"


def test_tiresias_preempts_and_resumes_on_other_nodes(cluster, tmp_path):
    address, topo_path, topology, ray_tmp = cluster
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    out = tmp_path / "out"
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:   # every listener of Ray's processes and of the ranks, while running
        while not done.is_set():
            seen.update(_listeners(_pids_with(str(ray_tmp)) + _pids_with(str(out))))
            time.sleep(0.3)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        r = subprocess.run([sys.executable, "-m", "phalanx.cli", "schedule", "--jobs",
                            str(jobs), "--cluster", str(topo_path), *SCHEDULE, "--ray-address",
                            address, "--out", str(out)], capture_output=True, text=True,
                           env=_env(), timeout=240, check=False)
    finally:
        done.set()
        watcher.join()
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {row["name"]: row for row in csv.DictReader((out / "jobs.csv").open())}
    assert all(rows[n]["status"] == "finished" for n in "ABCDZ"), rows
    assert all(rows[n]["preemptible"] == "yes" for n in "ABCD")
    assert rows["Z"]["preemptible"] == "no: --strategy model-parallel cannot resume"
    assert rows["Z"]["preemptions"] == "0"

    # the scheduler's placements per start, and what each rank recorded: Ray put each rank
    # on the node of the device we gave it, and the rank saw only that device
    names = [s.name for s in topology.servers]
    moved = ranks_where_placed(out, rows, topology, "ABCDZ")
    assert moved, f"no job resumed on other nodes: {rows}"
    assert len(names) == 3 and len(set(topology.server_rack)) == 2
    assert int(rows["A"]["preemptions"]) >= 1

    # the preempted sync job ends with the parameters of an uninterrupted run of it (the
    # same torchrun-style ranks, here on local slots)
    ref_jobs = tmp_path / "ref.yaml"
    ref_jobs.write_text("jobs:\n" + next(ln for ln in JOBS.splitlines() if "name: A" in ln)
                        + "\n")
    ref = tmp_path / "ref"
    subprocess.run([sys.executable, "-m", "phalanx.cli", "schedule", "--jobs", str(ref_jobs),
                    "--cluster", "uniform:1,1,1,2", "--out", str(ref)], check=True,
                   env=_env(), capture_output=True, timeout=120)
    ref = ref / "jobs" / "A"
    got = load_checkpoint(out / "jobs" / "A" / "checkpoint.pt")["model"]
    want = load_checkpoint(ref / "checkpoint.pt")["model"]
    assert got.keys() == want.keys()
    for k in got:
        assert torch.equal(got[k], want[k]), k
    assert sum(float(v.float().abs().sum()) for v in got.values()) > 0

    # nothing listened beyond loopback; no rank process is left
    assert seen and seen <= LOOPBACK, seen
    assert not _pids_with(str(out))


def test_sigint_mid_run_leaves_no_process(tmp_path):
    """The CLI builds its own Ray cluster; Ctrl-C (SIGINT to its process group) while jobs
    run stops the ranks, the actors and the cluster, removes Ray's temp folder, exits 130."""
    topo = "three-nodes"
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    out = tmp_path / "out"
    before = set(Path(p).name for p in Path("/tmp").glob("phalanx-ray-*"))
    # its own process group, so that the SIGINT reaches what a terminal's Ctrl-C reaches:
    # the command and the Ray processes it started
    p = subprocess.Popen([sys.executable, "-m", "phalanx.cli", "schedule", "--jobs",
                          str(jobs), "--cluster", str(topo), *SCHEDULE, "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(rank_record.read(out / "ranks" / "A.jsonl")) < 2:
            time.sleep(0.2)
        assert len(rank_record.read(out / "ranks" / "A.jsonl")) == 2, "no rank started"
        ours = [p for p in Path("/tmp").glob("phalanx-ray-*") if p.name not in before]
        assert ours and _pids_with(str(out))
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    time.sleep(2)   # what Ray's last processes might do on their way out
    assert not _pids_with(str(out)), "rank processes left behind"
    for folder in ours:
        assert not _pids_with(str(folder)), "Ray processes left behind"
        assert not folder.exists(), "Ray's temp folder left behind"
