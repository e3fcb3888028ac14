"""The server's allocator setting: large receive buffers are reused, not faulted in anew."""

import resource

import torch

from phalanx.runtime.memory import keep_freed_memory


def test_keep_freed_memory_stops_page_faults_of_repeated_large_buffers() -> None:
    assert keep_freed_memory()  # glibc (the Linux we run on) has mallopt
    src = torch.ones(1 << 20)

    def step() -> None:  # a 4 MB receive and two 4 MB results, all freed again
        buf = torch.empty(1 << 20)
        buf.copy_(src)
        upd = buf * 0.5
        upd2 = upd * 0.5
        del buf, upd, upd2

    for _ in range(5):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step()
    per_step = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20
    # glibc's adaptive thresholds gave the freed 12 MB back and faulted it in again:
    # ~3000 faults per step (measured); kept, a few dozen
    assert per_step < 300, per_step
