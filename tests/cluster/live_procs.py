"""What the live-engine tests look for on this host: processes by a piece of their command
line, the addresses their sockets listen on (/proc/net/tcp{,6}), each rank's record against
the scheduler's placement; a job's uninterrupted reference run, and what the node-loss
tests of every engine check."""

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from phalanx.cluster.chaos.raycluster import pids_with  # noqa: F401 - the tests import it from here
from phalanx.runtime import rank_record
from phalanx.runtime.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[2]

# 127.0.0.1 as /proc/net/tcp writes it, as an IPv4-mapped IPv6 address, and ::1
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}


def alive(pid: int) -> bool:
    """Running (a zombie an init that does not reap would keep is gone for us)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gone(pids: list[int], timeout_s: float = 5.0) -> bool:
    """Whether every process of ``pids`` has ended within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while any(alive(q) for q in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(q) for q in pids)


def listeners(pids: list[int]) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} writes them) of LISTEN sockets of pids."""
    inodes = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:
                found.add(cols[1].split(":")[0])
    return found


def ranks_where_placed(out: Path, rows: dict[str, dict], topology, jobs: str
                       ) -> list[tuple[str, list[str], list[str]]]:
    """Check every start of each job in ``jobs`` against the ranks' own records: one record
    per rank per start, each on the node of the device the scheduler gave it and seeing
    only that device, numbered on its node. Returns the moves (job, nodes before, nodes
    after) between consecutive starts."""
    moved = []
    for n in jobs:
        starts = [p.split("@")[1] for p in rows[n]["placements"].split(";")]
        recs = rank_record.read(out / "ranks" / f"{n}.jsonl")
        assert len(starts) == int(rows[n]["preemptions"]) + 1
        assert sorted((x.start, x.rank) for x in recs) == sorted(
            (k, r) for k, devs in enumerate(starts) for r in range(len(devs.split(","))))
        for x in recs:
            device = sorted(int(d) for d in starts[x.start].split(","))[x.rank]
            server = topology.servers[topology.device_server[device]]
            assert (x.node, x.devices) == (server.name, str(device - server.first_device)), x
        nodes = [sorted(x.node for x in recs if x.start == k) for k in range(len(starts))]
        moved += [(n, a, b) for a, b in zip(nodes, nodes[1:]) if a != b]
    return moved


def rows_of(out: Path) -> dict[str, dict]:
    """``jobs.csv`` of a schedule, by job name."""
    with open(out / "jobs.csv") as f:
        return {row["name"]: row for row in csv.DictReader(f)}


def resumed(out: Path, name: str) -> list[tuple[int, int]]:
    """(rank, step) of every ``resume`` event of job ``name``'s run."""
    with open(out / "jobs" / name / "events.jsonl") as f:
        events = [json.loads(ln) for ln in f]
    return sorted((e["rank"], e["step"]) for e in events if e["kind"] == "resume")


class Reference:
    """The job of ``line`` (a job-list entry), uninterrupted, on two local slots of this
    machine: started at once, beside the run it is the reference of. A test process runs
    each line once: a later test of the same job (the node-loss and kill -9 tests of one
    engine) compares with the run an earlier one made (a schedule and two ranks saved)."""

    _made: dict[tuple[str, str], Path] = {}   # (line, name) -> a finished reference's folder

    def __init__(self, tmp_path: Path, line: str, name: str, env: dict[str, str]) -> None:
        self.key, self.name = (line, name), name
        self.out = self._made.get(self.key)
        self.proc = None
        if self.out is not None:
            return
        jobs = tmp_path / f"ref-{name}.yaml"
        jobs.write_text("jobs:\n" + line + "\n")
        self.out = tmp_path / f"ref-{name}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "phalanx.cli", "schedule", "--jobs", str(jobs), "--cluster",
             "uniform:1,1,1,2", "--out", str(self.out)], env=env, cwd=REPO,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def assert_same_parameters(self, out: Path) -> None:
        """The job's final parameters in ``out`` are the reference's, bit for bit."""
        if self.proc is not None:
            _, err = self.proc.communicate(timeout=180)
            assert self.proc.returncode == 0, err
            self._made[self.key] = self.out
        got = load_checkpoint(out / "jobs" / self.name / "checkpoint.pt")["model"]
        want = load_checkpoint(self.out / "jobs" / self.name / "checkpoint.pt")["model"]
        assert got.keys() == want.keys() and got
        for k in got:
            assert torch.equal(got[k], want[k]), k


def check_lost_node_run(out: Path, stdout: str, starts: tuple[str, ...] = ("0,1", "0,2"),
                        lost: str = "b") -> None:
    """The node-loss scenario of the Ray and Slurm tests: S ran on the devices of each of
    ``starts`` in turn (``three-nodes``: device 0 on node a, 1 on b, 2 on c), lost a node
    of each start but the last, and resumed both ranks from a checkpoint each time,
    charged neither as a failure nor a preemption; each node of ``lost`` was lost and came
    back; G (3 devices) ran on a, b, c once every node was back."""
    for node in lost:
        assert f"phalanx: scheduler: server {node} lost" in stdout, stdout
        assert f"phalanx: scheduler: server {node} is back" in stdout, stdout
    assert "2 finished, 0 failed" in stdout, stdout
    rows = rows_of(out)
    assert [x.split("@")[1] for x in rows["S"]["placements"].split(";")] == list(starts)
    assert rows["S"]["preemptions"] == "0"
    recs = rank_record.read(out / "ranks" / "S.jsonl")
    assert sorted((x.start, x.node) for x in recs) == sorted(
        (k, "abc"[int(d)]) for k, devs in enumerate(starts) for d in devs.split(","))
    assert [r for r, _ in resumed(out, "S")] == sorted([0, 1] * (len(starts) - 1))
    assert rows["G"]["placements"].split("@")[1] == "0,1,2"
    assert {x.node for x in rank_record.read(out / "ranks" / "G.jsonl")} == {"a", "b", "c"}


def wait_for_checkpoint(out: Path, name: str, proc: subprocess.Popen,
                        timeout_s: float = 120.0) -> None:
    """Until job ``name`` of the schedule ``proc`` runs has written a checkpoint (the
    schedule still running)."""
    ckpt = out / "jobs" / name / "checkpoint.pt"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not ckpt.exists() and proc.poll() is None:
        time.sleep(0.05)
    assert ckpt.exists() and proc.poll() is None, f"{name} never checkpointed while running"
