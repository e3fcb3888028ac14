"""Gradient buckets reduced while backward is still running (what DDP's reducer does).

Parameters are grouped, in reverse registration order (roughly the order autograd finishes
their gradients), into buckets of at most ``bucket_bytes``. A post-accumulate-grad hook on
every parameter counts down its bucket; a full bucket is flattened and handed to one
communication thread, which runs the allreduce while autograd computes the next layers'
gradients. Buckets are launched strictly in index order so every rank issues the same
collectives in the same order (gloo pairs them up by order, not by name).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from phalanx.comm.allreduce import AllReduce

if TYPE_CHECKING:
    from phalanx.comm.exchange import Compression


def assign_buckets(sizes: Sequence[int], dtypes: Sequence[torch.dtype],
                   cap_bytes: int) -> list[list[int]]:
    """Indices of the parameters in each bucket: reverse order, at most ``cap_bytes`` per
    bucket (a bigger parameter gets a bucket of its own), one dtype per bucket."""
    buckets: list[list[int]] = []
    current: list[int] = []
    current_bytes = 0
    for i in reversed(range(len(sizes))):
        size = sizes[i] * torch.empty((), dtype=dtypes[i]).element_size()
        if current and (current_bytes + size > cap_bytes or dtypes[current[0]] != dtypes[i]):
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(i)
        current_bytes += size
    if current:
        buckets.append(current)
    return buckets


class CommThread:
    """One background thread that runs submitted calls in FIFO order (so collectives keep
    the same order on every rank) and lets the caller wait for all of them."""

    def __init__(self) -> None:
        self._tasks: queue.Queue[Callable[[], Any] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="phalanx-comm", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            task = self._tasks.get()
            try:
                if task is None:
                    return
                if self._error is None:  # after a failure, drain without running
                    task()
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                self._error = e
            finally:
                self._tasks.task_done()

    def submit(self, fn: Callable[[], Any]) -> None:
        self._tasks.put(fn)

    def wait(self) -> None:
        """Block until every submitted call ran; re-raise the first failure here."""
        self._tasks.join()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        self._tasks.put(None)
        self._thread.join(timeout=10)


@dataclass
class _Bucket:
    params: list[torch.nn.Parameter]
    pending: int = 0
    launched: bool = False
    flat: torch.Tensor | None = field(default=None, repr=False)


@dataclass
class ReducerStats:
    steps: int = 0
    buckets_launched: int = 0
    launched_in_backward: int = 0  # buckets whose allreduce started before backward ended
    wait_s: float = 0.0  # time the training loop blocked on communication after backward


class GradReducer:
    """Averages ``.grad`` of ``params`` over the group, bucket by bucket, overlapped with
    backward. Use::

        reducer.begin(sync=last_micro_step)   # before loss.backward()
        loss.backward()
        reducer.finish()                      # grads are now averaged (when sync)
    """

    def __init__(self, params: Sequence[torch.nn.Parameter], allreduce: AllReduce, world: int,
                 bucket_bytes: int, comm: CommThread,
                 compression: Compression | None = None,
                 wire: torch.dtype = torch.float32) -> None:
        self.allreduce, self.world, self.comm = allreduce, world, comm
        self.compression = compression  # --compress: each bucket's mean goes through it
        self.wire = wire  # --precision bf16: buckets travel (and are summed) in bf16
        params = [p for p in params if p.requires_grad]
        order = assign_buckets([p.numel() for p in params], [p.dtype for p in params],
                               bucket_bytes)
        self.buckets = [_Bucket([params[i] for i in idx]) for idx in order]
        self._bucket_of: dict[int, int] = {}
        for b, bucket in enumerate(self.buckets):
            for p in bucket.params:
                self._bucket_of[id(p)] = b
        self._next = 0  # next bucket to launch (launch order = index order)
        self._sync = False
        self._in_backward = False
        self.stats = ReducerStats()
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in params]

    def begin(self, sync: bool) -> None:
        """``sync=False`` on the non-final micro-steps of gradient accumulation: gradients
        only accumulate locally, nothing is sent (DDP's ``no_sync``)."""
        self._sync = sync
        self._in_backward = True
        for bucket in self.buckets:
            bucket.pending = len(bucket.params)
            bucket.launched = False
        self._next = 0

    def _on_grad(self, p: torch.Tensor) -> None:
        # runs inside autograd, right after p.grad is final for this backward
        if not self._sync:
            return
        bucket = self.buckets[self._bucket_of[id(p)]]
        bucket.pending -= 1
        self._launch_ready()

    def _launch_ready(self, force: bool = False) -> None:
        while self._next < len(self.buckets):
            bucket = self.buckets[self._next]
            if bucket.pending > 0 and not force:
                return  # a later bucket may be ready, but order must match on every rank
            self._launch(bucket)
            self._next += 1

    def _launch(self, bucket: _Bucket) -> None:
        # a parameter that took no part in this backward contributes zeros (as DDP's
        # find_unused_parameters does), so every rank still sends the same bucket
        # a sparse gradient (an embedding table's) travels densified: the whole table
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket.params]
        grads = [g.to_dense() if g.is_sparse else g for g in grads]
        bucket.flat = torch.cat([g.reshape(-1) for g in grads])
        bucket.launched = True
        self.stats.buckets_launched += 1
        if self._in_backward:
            self.stats.launched_in_backward += 1
        flat, world = bucket.flat, self.world
        key, shapes = self._next, [p.shape for p in bucket.params]

        def reduce_and_average() -> None:
            if self.compression is not None:
                self.compression.mean_(flat, shapes, self.allreduce, world, key)
                return
            if self.wire != flat.dtype:
                # divided first, as DDP's bf16_compress_hook: the sum of N means in bf16
                wire = flat.div(world).to(self.wire)
                self.allreduce(wire)
                flat.copy_(wire)
                return
            self.allreduce(flat)
            flat.div_(world)

        self.comm.submit(reduce_and_average)

    def finish(self) -> None:
        """After backward: launch what did not fill up, wait for all buckets, write the
        averaged gradients back into ``.grad``."""
        self._in_backward = False
        if not self._sync:
            return
        self._launch_ready(force=True)
        t0 = time.perf_counter()
        self.comm.wait()  # sync point: the optimizer needs every averaged gradient
        self.stats.wait_s += time.perf_counter() - t0
        self.stats.steps += 1
        for bucket in self.buckets:
            offset = 0
            for p in bucket.params:
                n = p.numel()
                averaged = bucket.flat[offset : offset + n].view_as(p)
                if p.grad is None or p.grad.is_sparse:
                    p.grad = averaged.clone()
                else:
                    p.grad.copy_(averaged)
                offset += n
            bucket.flat = None

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
