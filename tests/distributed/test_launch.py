"""The local launcher with real processes: groups form, and a failing rank is reported by
its own error even when its peers then fail too."""

import json
import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from phalanx.errors import PhalanxError
from phalanx.runtime.launch import WorkerFailed, spawn


def _sum_ranks(rank, world, out_dir):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    (out_dir / f"{rank}.txt").write_text(str(t.item()))


def _root_cause(rank, world):
    if rank == 1:
        time.sleep(0.2)
        raise PhalanxError("bad message from the test")
    # rank 0 waits on rank 1, which dies: rank 0 then fails with a connection error
    dist.recv(torch.zeros(1), src=1)


def test_group_forms_and_collectives_work(tmp_path):
    spawn(_sum_ranks, 3, (tmp_path,))
    assert [float((tmp_path / f"{r}.txt").read_text()) for r in range(3)] == [3.0] * 3


def test_first_failure_is_reported(tmp_path):
    with pytest.raises(WorkerFailed, match="process 1 failed: PhalanxError: bad message"):
        spawn(_root_cause, 2)


def _listening_addresses(pids):
    """(address hex, port) of every listening TCP socket the given processes own."""
    inodes = set()
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        for fd in fd_dir.iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A = LISTEN
                addr, port = cols[1].split(":")
                found.append((addr, int(port, 16)))
    return found


def _report_listeners(rank, world, out_dir):
    dist.barrier()  # every rank's gloo sockets exist now
    if rank == 0:
        pids = [os.getppid()] + [int(p) for p in os.listdir("/proc") if p.isdigit()
                                 and _is_child_of(int(p), os.getppid())]
        (out_dir / "listeners.json").write_text(json.dumps(_listening_addresses(pids)))
    dist.barrier()


def _is_child_of(pid, parent):
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return int(stat.rsplit(")", 1)[1].split()[1]) == parent


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
def test_every_listening_socket_is_on_loopback(tmp_path):
    spawn(_report_listeners, 2, (tmp_path,))
    listeners = json.loads((tmp_path / "listeners.json").read_text())
    assert listeners, "expected the rendezvous store and gloo to listen"
    loopback = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1
    assert all(addr in loopback for addr, _ in listeners), listeners
