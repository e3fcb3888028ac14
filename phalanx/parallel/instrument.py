"""Measuring a pipeline stage from the inside: compute time, live activations, stragglers.

:class:`StageMeter` hooks a stage's module: the forward and backward of every micro-batch
are timed (the rest of a step's wall time is the stage waiting for its neighbours: the
pipeline bubble plus transfers), the number of micro-batches whose forward ran but whose
backward did not (the activations the stage holds) is tracked, and, inside
:meth:`StageMeter.saving`, the bytes autograd actually saved for backward are counted as
they are saved and as they are freed. All three are measured, not derived from a formula.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator

import torch
from torch import nn

from phalanx.parallel.base import Straggler


class _Saved:
    """A tensor autograd saved for backward; its bytes leave the count when it is freed."""

    __slots__ = ("meter", "nbytes", "tensor")

    def __init__(self, meter: StageMeter, tensor: torch.Tensor) -> None:
        self.meter, self.tensor = meter, tensor
        self.nbytes = tensor.numel() * tensor.element_size()
        meter.live_bytes += self.nbytes
        meter.peak_bytes = max(meter.peak_bytes, meter.live_bytes)

    def __del__(self) -> None:
        self.meter.live_bytes -= self.nbytes


class StageMeter:
    def __init__(self, module: nn.Module, straggler: Straggler | None = None) -> None:
        self.compute_s = 0.0
        self.live = self.peak_live = 0  # micro-batches forwarded but not yet backwarded
        self.live_bytes = self.peak_bytes = 0
        self.forwards = self.backwards = 0
        self.straggler = straggler or Straggler(1.0)
        # parameters are saved by reference, not copied: they are not activations
        self._params = {p.data_ptr() for p in module.parameters()}

    @contextlib.contextmanager
    def computing(self, backward: bool) -> Iterator[None]:
        """Time one micro-batch's forward or backward; a slow device stretches it."""
        t = time.perf_counter()
        self.straggler.start()
        yield
        self.straggler.finish()
        self.compute_s += time.perf_counter() - t
        if backward:
            self.backwards += 1
            self.live -= 1
        else:
            self.forwards += 1
            self.live += 1
            self.peak_live = max(self.peak_live, self.live)

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        """Count the bytes autograd saves for backward while the block runs."""
        def pack(t: torch.Tensor):
            if t.data_ptr() in self._params:
                return t
            return _Saved(self, t)

        def unpack(saved):
            return saved.tensor if isinstance(saved, _Saved) else saved

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield


@functools.cache
def metered_stage_class() -> type:
    """``MeteredStage``, a ``PipelineStage`` subclass. Made on first use:
    ``torch.distributed.pipelining`` takes about 1.6 s to import, which every ``phalanx``
    command would otherwise pay (the registry imports every strategy)."""
    from torch.distributed.pipelining import PipelineStage

    class MeteredStage(PipelineStage):
        """A ``PipelineStage`` whose per-micro-batch forward and backward run under a
        :class:`StageMeter` (the schedule's waits for neighbours happen outside them)."""

        def __init__(self, meter: StageMeter, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.meter = meter

        def forward_one_chunk(self, *args, **kwargs):
            with self.meter.computing(backward=False):
                return super().forward_one_chunk(*args, **kwargs)

        def backward_one_chunk(self, *args, **kwargs):
            with self.meter.computing(backward=True):
                return super().backward_one_chunk(*args, **kwargs)

    return MeteredStage
