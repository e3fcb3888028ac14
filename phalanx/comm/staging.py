"""GPU tensors over gloo: through pinned host buffers.

gloo cannot send or receive CUDA tensors (point-to-point on a CUDA pointer aborts the
process with ``gloo::IoException ... Bad address``), so where gloo carries the traffic of
GPU ranks (ranks sharing a GPU, the parameter server) every tensor crosses the process
boundary as a host copy. A pinned buffer makes the device-to-host and host-to-device copies
DMA transfers; one buffer per (size, dtype) is kept, so a bucketed allreduce reuses them
step after step instead of pinning memory each time (pinning is slow).

Copies here are synchronous on purpose: a buffer is reused by the next call, and an
asynchronous host-to-device copy still reading it would race with the next device-to-host
copy writing it.
"""

from __future__ import annotations

import threading

import torch


class PinnedPool:
    """Reusable pinned host buffers, keyed by (numel, dtype, slot). Thread-safe."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[int, torch.dtype, int], torch.Tensor] = {}
        self._lock = threading.Lock()

    def get(self, numel: int, dtype: torch.dtype, slot: int = 0) -> torch.Tensor:
        key = (numel, dtype, slot)
        with self._lock:
            buf = self._buffers.get(key)
            if buf is None:
                buf = torch.empty(numel, dtype=dtype, pin_memory=torch.cuda.is_available())
                self._buffers[key] = buf
            return buf


def to_host(t: torch.Tensor, pool: PinnedPool | None = None, slot: int = 0) -> torch.Tensor:
    """A host tensor with ``t``'s values (``t`` itself when it is already on the host).
    With a pool the result is a reused pinned buffer: valid until the next call with the
    same size, dtype and slot."""
    if t.device.type == "cpu":
        return t
    if pool is None:
        return t.detach().to("cpu")
    buf = pool.get(t.numel(), t.dtype, slot)
    buf.copy_(t.detach().reshape(-1))  # sync point: waits for the kernels that wrote t
    return buf.view(t.shape)


def host_vector(t: torch.Tensor) -> torch.Tensor:
    """A host copy of ``t`` to receive into (pinned when ``t`` is on a GPU); ``t`` itself
    when it is already on the host."""
    if t.device.type == "cpu":
        return t
    return t.detach().to("cpu").pin_memory()


class HostStagedAllReduce:
    """An allreduce of device tensors done by ``inner`` (ring, native or main node, over
    gloo) on a pinned host copy; the sum is copied back into the device tensor."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name, self.estimated = inner.name, inner.estimated
        self.pool = PinnedPool()

    @property
    def counter(self):
        return self.inner.counter

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type == "cpu":
            return self.inner(tensor)
        host = to_host(tensor, self.pool)
        self.inner(host)
        tensor.copy_(host.view_as(tensor))
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        if tensor.device.type == "cpu":
            return self.inner.all_gather(tensor)
        parts = self.inner.all_gather(tensor.detach().to("cpu"))
        return [p.to(tensor.device) for p in parts]


def gloo_carries(t: torch.Tensor) -> bool:
    """``t`` is a device tensor and the process group has no NCCL for it: a collective
    or send of ``t`` must go through a host copy."""
    import torch.distributed as dist

    return t.device.type != "cpu" and "nccl" not in str(dist.get_backend_config())


def staged(allreduce, host_staging: bool):
    """``allreduce`` as a rank with this placement must call it."""
    return HostStagedAllReduce(allreduce) if host_staging else allreduce


# ---- point-to-point between known peers (model parallelism) ------------------------------


def send(t: torch.Tensor, dst: int, host_staging: bool, group=None) -> None:
    """``dist.send`` of ``t``; a device tensor goes as a host copy where gloo carries it."""
    import torch.distributed as dist

    if host_staging and t.device.type != "cpu":
        t = t.detach().to("cpu")
    dist.send(t.detach().contiguous(), dst, group=group)


def recv(buf: torch.Tensor, src: int, host_staging: bool, group=None) -> torch.Tensor:
    """``dist.recv`` into ``buf`` (through a host buffer where gloo carries it)."""
    import torch.distributed as dist

    if host_staging and buf.device.type != "cpu":
        host = torch.empty(buf.shape, dtype=buf.dtype)
        dist.recv(host, src, group=group)
        buf.copy_(host)
    else:
        dist.recv(buf, src, group=group)
    return buf


class DeviceHop(torch.nn.Module):
    """``inner`` computing on ``device`` behind host inputs and outputs: a pipeline stage
    whose schedule moves activations over gloo (host tensors) while the layers run on a
    GPU. Autograd carries the gradients back across both copies."""

    def __init__(self, inner: torch.nn.Module, device: torch.device) -> None:
        super().__init__()
        self.inner, self.device = inner, device

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.inner(*(a.to(self.device) for a in args)).to("cpu")
