"""Issue 33: every rank binds where the others connect. An engine (Ray) hands a gang the
node's network address as MASTER_ADDR even when all its ranks share one machine; rank 0's
store and gloo must then listen there, not on loopback. And a rank 0 handed an address that
is not its host's ends at once with one line."""

import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from phalanx.cluster.core.report import write_jobs_csv
from phalanx.cluster.core.topology import uniform
from phalanx.cluster.live.config import LiveConfig
from phalanx.cluster.live.engines.local import LocalExecutor
from phalanx.cluster.live.joblist import load_job_list
from phalanx.cluster.live.loop import LiveCluster
from phalanx.cluster.policies import Pack, make_ordering
from phalanx.parallel.dp_checkpoint import KILLED_EXIT
from phalanx.runtime import netif
from phalanx.runtime.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[2]
SYNC = ("{model: mlp, data: synthetic, epochs: 100, strategy: sync, tensorboard: false, "
        "seed: 5, max_steps: 30}")


def own_address() -> str:
    """One of this host's non-loopback addresses (what Ray reports as a node's address)."""
    addr = next((a for a in netif.local_addrs() if not a.startswith("127.")), None)
    if addr is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    return addr


def run_gang(tmp_path: Path, master: str, name: str) -> tuple[dict, Path]:
    jobs = tmp_path / f"{name}.yaml"
    jobs.write_text(f"jobs:\n  - {{name: {name}, arrival: 0, gpus: 2, config: {SYNC}}}\n")
    out = tmp_path / f"out-{name}"
    live = LiveCluster(uniform(servers=1, devices=2), load_job_list(jobs),
                       make_ordering("fifo"), Pack(), LiveConfig(out, poll_s=0.02),
                       executor=LocalExecutor(master_addr=master))
    res = live.run()
    return {j.spec.name: j for j in res.jobs}[name], out


def test_two_rank_gang_told_the_node_address_trains(tmp_path):
    """The user's failure: both ranks on one machine, MASTER_ADDR the node's own network
    address (what Ray reports). Before the fix rank 0's store listened on 127.0.0.1 only and
    rank 1 waited 120 s for it at MASTER_ADDR; now it trains to the loopback run's params."""
    addr = own_address()
    st, out = run_gang(tmp_path, addr, "node")
    assert st.failure == "", st.failure
    ref, ref_out = run_gang(tmp_path, "127.0.0.1", "lo")
    assert ref.failure == "", ref.failure
    got = load_checkpoint(out / "jobs" / "node" / "checkpoint.pt")["model"]
    want = load_checkpoint(ref_out / "jobs" / "lo" / "checkpoint.pt")["model"]
    assert got.keys() == want.keys() and got
    for k in got:
        assert torch.equal(got[k], want[k]), k


def test_rank_0_told_a_foreign_master_fails_in_seconds_with_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": "0", "WORLD_SIZE": "2",
           "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "192.0.2.77", "MASTER_PORT": "29999",
           "TORCHELASTIC_USE_AGENT_STORE": "False"}
    env.pop("GLOO_SOCKET_IFNAME", None)
    if "192.0.2.77" in netif.local_addrs():
        pytest.skip("192.0.2.77 is this host's")
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "phalanx.entry.scheduled", "--strategy", "sync",
                        "--workers", "2", "--model", "mlp", "--data", "synthetic",
                        "--max-steps", "5", "--out", str(tmp_path / "run")],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
                       check=False)
    took = time.monotonic() - t
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines == [lines[0]] and lines[0].startswith(
        "phalanx: error: rank 0 serves the group at MASTER_ADDR 192.0.2.77 (192.0.2.77), "
        "which is not an address of this host (have "), r.stderr
    # under 5 s (issue 33), a Python and torch start-up included; on a machine loaded beyond
    # twice its cores that start-up alone takes longer (7 s seen at load 10): there the
    # bound only tells seconds from the 120 s store timeout
    assert took < (5 if os.getloadavg()[0] <= 2 * (os.cpu_count() or 1) else 20), took


# ---------------------------------------------------------------- fail fast (issue 33)

def run_failing(tmp_path: Path, master: str, config: str, restarts: int,
                poll_s: float = 0.02):
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"jobs:\n  - {{name: f, arrival: 0, gpus: 2, config: {config}}}\n")
    out = tmp_path / "out"
    live = LiveCluster(uniform(servers=1, devices=2), load_job_list(jobs),
                       make_ordering("fifo"), Pack(),
                       LiveConfig(out, poll_s=poll_s, max_job_restarts=restarts),
                       executor=LocalExecutor(master_addr=master))
    t = time.monotonic()
    res = live.run()
    took = time.monotonic() - t
    write_jobs_csv(res, out / "jobs.csv")
    rows = {row["name"]: row for row in csv.DictReader((out / "jobs.csv").open())}
    return {j.spec.name: j for j in res.jobs}["f"], rows["f"], took, out


def test_a_rank_that_cannot_join_fails_its_job_in_seconds_then_restarts(tmp_path):
    """Rank 0 handed an address that is not its host's: it ends at once, rank 1 (waiting
    for rank 0's store) is stopped, the job starts again once (--max-job-restarts 1) and
    then fails, with one line in jobs.csv naming the rank and the cause."""
    if "192.0.2.77" in netif.local_addrs():
        pytest.skip("192.0.2.77 is this host's")
    st, row, took, out = run_failing(tmp_path, "192.0.2.77", SYNC, restarts=1)
    assert st.restarts == 1 and len(st.placements) == 2 and st.preemptions == 0
    assert row["status"] == (
        "failed: rank 0 exit 2: phalanx: error: rank 0 serves the group at MASTER_ADDR "
        "192.0.2.77 (192.0.2.77), which is not an address of this host (have "
        + ", ".join(f"{a} ({n})" for a, n in netif.local_addrs().items())
        + ") (after 1 restart)"), row
    assert "\n" not in row["status"] and "Traceback" not in row["status"]
    # two starts (each: two interpreters importing torch, rank 1 stopped 2 s after rank 0
    # ended), never the 120 s store timeout
    assert took < 30, took


def test_a_rank_that_dies_fails_its_job_with_its_line(tmp_path):
    """Rank 1 dies mid-training (an injected fault): rank 0, blocked in a collective, is
    stopped; with --max-job-restarts 0 the job fails at once, its line names rank 1 and
    what it said, not rank 0's consequence. The scheduler polls every 0.5 s, so it finds
    both ranks ended (rank 0 fails milliseconds after rank 1, on the reset connection), as
    a loaded machine's loop does: the order it saw them in cannot tell (CI named rank 0),
    the claim rank 1 made before it exited does."""
    config = SYNC[:-1] + ", kill_worker: '1@5'}"
    st, row, took, out = run_failing(tmp_path, "127.0.0.1", config, restarts=0, poll_s=0.5)
    assert (out / "ranks" / "f.0.failed").read_text() == f"1 {KILLED_EXIT}\n"
    assert st.restarts == 0 and len(st.placements) == 1
    assert row["status"] == (f"failed: rank 1 exit {KILLED_EXIT}: phalanx: fault injection: "
                             "worker 1 killed at step 5"), row
    assert took < 20, took
