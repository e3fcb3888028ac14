"""Our ring and main-node allreduce against ``dist.all_reduce`` (the oracle) on random shapes
and world sizes, in real processes. One group of 4 processes is spawned once; world sizes
1..4 are subgroups of it, and hypothesis (derandomised, so every rank draws the same
examples) loops over shapes inside the processes."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from phalanx.comm.allreduce import (
    MainNodeAllReduce,
    NativeAllReduce,
    RingAllReduce,
    chunk_bounds,
    ring_bytes,
)
from phalanx.runtime.launch import spawn

WORLD = 4
EXAMPLES = 40


def _worker(rank: int, world: int, out: str) -> None:
    groups = {n: dist.new_group(list(range(n))) for n in range(1, world + 1)}
    checked = {"examples": 0, "bytes_checked": 0}

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(n=st.integers(1, world), shape=st.lists(st.integers(0, 70), min_size=1, max_size=3),
           dtype=st.sampled_from([torch.float32, torch.float64, torch.int64]),
           seed=st.integers(0, 2**31 - 1))
    def check(n: int, shape: list[int], dtype: torch.dtype, seed: int) -> None:
        ok = True
        if rank < n:
            group = groups[n]
            g = torch.Generator().manual_seed(seed + rank)
            # integers (also stored as floats) sum exactly in any order: results must be equal
            x = torch.randint(-10_000, 10_000, shape, generator=g).to(dtype)
            expected = x.clone()
            dist.all_reduce(expected, group=group)
            ring, main = RingAllReduce(group), MainNodeAllReduce(group)
            got_ring, got_main = ring(x.clone()), main(x.clone())
            ok = torch.equal(got_ring, expected) and torch.equal(got_main, expected)
            numel, size = x.numel(), x.element_size()
            ok = ok and ring.counter.sent == ring_bytes(numel, size, n, rank)
            # each rank receives what its left neighbour sends
            ok = ok and ring.counter.received == ring_bytes(numel, size, n, (rank - 1) % n)
            if n > 1 and numel % n == 0:  # the seeds' formula, exactly
                ok = ok and ring.counter.sent == 2 * numel * size * (n - 1) // n
            main_expected = (numel * size * (n - 1) if rank == 0 else numel * size) if (
                n > 1 and numel) else 0
            ok = ok and main.counter.sent == main.counter.received == main_expected
            # and the whole ring moved 2X(N-1) in total
            total = torch.tensor([ring.counter.sent], dtype=torch.int64)
            dist.all_reduce(total, group=group)
            ok = ok and int(total) == 2 * numel * size * (n - 1)
            checked["examples"] += 1
        # every rank must agree on pass/fail, or hypothesis would shrink differently on each
        flag = torch.tensor([0 if ok else 1])
        dist.all_reduce(flag)
        assert int(flag) == 0, f"allreduce mismatch: n={n} shape={shape} dtype={dtype}"

    check()
    # random real numbers: equal up to summation order
    for n in range(2, world + 1):
        if rank < n:
            for numel in (1, n - 1, 1000, 4099):
                x = torch.randn(numel, generator=torch.Generator().manual_seed(rank + numel))
                expected = x.clone()
                dist.all_reduce(expected, group=groups[n])
                assert torch.allclose(RingAllReduce(groups[n])(x.clone()), expected, atol=1e-5)
                # tiny segments: many messages per ring step, matched on both ends
                segmented = RingAllReduce(groups[n], segment_bytes=12)(x.clone())
                assert torch.allclose(segmented, expected, atol=1e-5)
                assert torch.allclose(NativeAllReduce(groups[n])(x.clone()), expected)
        dist.barrier()
    # all_gather of every implementation returns every rank's tensor in rank order
    for impl in (RingAllReduce(), NativeAllReduce(), MainNodeAllReduce()):
        parts = impl.all_gather(torch.full((3, 2), float(rank)))
        assert [int(p[0, 0]) for p in parts] == list(range(world)), impl.name
    if rank == 0:
        (Path(out) / "checked.json").write_text(json.dumps(checked))


def test_ring_and_main_node_equal_native_allreduce(tmp_path: Path) -> None:
    spawn(_worker, WORLD, (str(tmp_path),))
    checked = json.loads((tmp_path / "checked.json").read_text())
    assert checked["examples"] >= EXAMPLES // 2  # rank 0 took part in every example


def test_chunk_bounds_cover_sizes_below_world() -> None:
    assert chunk_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
