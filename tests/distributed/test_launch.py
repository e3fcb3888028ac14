"""The local launcher with real processes: groups form, and a failing rank is reported by
its own error even when its peers then fail too."""

import time

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
