"""Host staging and device batches, on the CPU: they must be exact no-ops there (the CPU
runs keep their results), and the staged allreduce sums through its host buffer."""

import torch

from phalanx.comm.staging import HostStagedAllReduce, PinnedPool, to_host
from phalanx.data import Dataset
from phalanx.parallel.device_data import DeviceData


class _Doubling:
    """A stand-in 'allreduce' of a world of two equal ranks: the sum is 2x."""

    name, estimated = "double", False
    counter = None

    def __init__(self):
        self.seen = []

    def __call__(self, t):
        self.seen.append(t)
        return t.mul_(2)

    def all_gather(self, t):
        return [t.clone(), t.clone()]


def test_cpu_tensors_pass_straight_through():
    inner = _Doubling()
    staged = HostStagedAllReduce(inner)
    t = torch.arange(4.0)
    assert staged(t) is t and torch.equal(t, torch.arange(4.0) * 2)
    assert inner.seen[0] is t  # no copy on the host
    assert to_host(t) is t and to_host(t, PinnedPool()) is t


def test_pinned_pool_reuses_one_buffer_per_size():
    pool = PinnedPool()
    a, b = pool.get(8, torch.float32), pool.get(8, torch.float32)
    assert a is b and pool.get(8, torch.float32, slot=1) is not a
    assert pool.get(8, torch.float64).dtype == torch.float64


def test_device_data_on_cpu_is_plain_indexing():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(20, 1, 4, 4, generator=g), torch.randint(0, 3, (20,), generator=g)
    data = DeviceData(Dataset("t", x, y, 3), "cpu", on_device=True)
    assert not data.resident  # nothing moves on the CPU
    idx = torch.tensor([3, 1, 7])
    bx, by = data.batch(idx)
    assert torch.equal(bx, x[idx]) and torch.equal(by, y[idx])
    flip = lambda t, gen: t.flip(-1)  # noqa: E731
    ax, _ = data.batch(idx, flip, None)
    assert torch.equal(ax, x[idx].flip(-1))
