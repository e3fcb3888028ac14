"""Gradient buckets: assignment, launch order, overlap with backward and no-sync
accumulation, in one process on a real one-rank gloo group."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from phalanx.comm.allreduce import RingAllReduce
from phalanx.comm.bucketing import CommThread, GradReducer, assign_buckets


def test_buckets_are_reverse_order_capped_and_single_dtype() -> None:
    f32, f64 = torch.float32, torch.float64
    # sizes in elements; cap 100 bytes = 25 float32
    assert assign_buckets([10, 10, 10, 10], [f32] * 4, 100) == [[3, 2], [1, 0]]
    assert assign_buckets([100, 5, 5], [f32] * 3, 100) == [[2, 1], [0]]  # big one alone
    assert assign_buckets([5, 5, 5], [f32, f64, f32], 1000) == [[2], [1], [0]]
    assert assign_buckets([], [], 100) == []


@pytest.fixture
def one_rank_group():
    if dist.is_initialized():
        pytest.skip("a default process group already exists in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_buckets_launch_during_backward_and_accumulation_skips_sync(one_rank_group) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 30), nn.ReLU(), nn.Linear(30, 30), nn.ReLU(),
                          nn.Linear(30, 5))
    params = list(model.parameters())
    comm = CommThread()
    reducer = GradReducer(params, RingAllReduce(), 1, bucket_bytes=30 * 30 * 4, comm=comm)
    assert len(reducer.buckets) >= 3
    launched_seen = []  # buckets launched so far, each time a gradient became ready
    for p in params:  # registered after the reducer's hooks: they run after it saw the grad
        p.register_post_accumulate_grad_hook(
            lambda p: launched_seen.append(reducer.stats.buckets_launched))

    x, y = torch.randn(8, 20), torch.randint(0, 5, (8,))
    reference = [torch.zeros_like(p) for p in params]
    for micro in range(2):
        reducer.begin(sync=micro == 1)
        loss = nn.functional.cross_entropy(model(x[micro::2]), y[micro::2])
        loss.backward()
        reducer.finish()
        g = torch.autograd.grad(nn.functional.cross_entropy(model(x[micro::2]), y[micro::2]),
                                params)
        reference = [r + gi for r, gi in zip(reference, g)]
        if micro == 0:
            assert reducer.stats.buckets_launched == 0  # no_sync: nothing sent
    # buckets went out while gradients of earlier layers were still being computed
    last_backward = launched_seen[len(params):]
    assert last_backward[0] == 0 and last_backward[-1] == len(reducer.buckets)
    assert any(n >= 1 for n in last_backward[:-1])
    assert reducer.stats.buckets_launched == len(reducer.buckets)
    for p, r in zip(params, reference):  # world 1: the average is the accumulated sum
        assert torch.allclose(p.grad, r, atol=1e-6)
    comm.close()
    reducer.remove()


def test_comm_thread_reraises_a_failure_in_the_caller() -> None:
    comm = CommThread()
    comm.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        comm.wait()
    comm.close()
