"""Overlap of gradient communication with the backward pass: the bucket timeline of
``phalanx/comm/bucketing.py`` (DDP's reducer), on a workload's layers.

Layers are grouped in reverse order into buckets of at most ``cap`` bytes (a bigger layer
gets a bucket of its own), exactly as ``comm.bucketing.assign_buckets`` groups parameters.
With a fusion cycle (Horovod's tensor fusion, as Zhang et al. 2020's simulator models it),
layers join the open bucket in backward order and it closes once the backward pass has run
a cycle since the last one closed, or once it holds ``cap`` bytes (the layer that crosses
either line stays in it).

A bucket is ready when the backward pass has finished its last layer; one communication
thread reduces buckets strictly in order, so bucket k starts at max(its ready time, the end
of bucket k-1). What the step waits for after backward is the exposed communication.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from phalanx.scale.workload import Workload


def assign_buckets(sizes: Sequence[int], cap_bytes: int) -> list[list[int]]:
    """``comm.bucketing.assign_buckets`` for one dtype: indices per bucket, reverse order."""
    buckets: list[list[int]] = []
    current: list[int] = []
    current_bytes = 0
    for i in reversed(range(len(sizes))):
        if current and current_bytes + sizes[i] > cap_bytes:
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(i)
        current_bytes += sizes[i]
    if current:
        buckets.append(current)
    return buckets


def fusion_buckets(sizes: Sequence[int], durations: Sequence[float], cap_bytes: int,
                   cycle_s: float) -> list[list[int]]:
    """Horovod-style fusion: indices per bucket in backward (reverse) order; layer i's
    backward takes ``durations[i]``; a bucket closes at ``cycle_s`` of backward or at
    ``cap_bytes``, whichever comes first, keeping the layer that crossed the line."""
    buckets: list[list[int]] = []
    current: list[int] = []
    ran, held = 0.0, 0
    for i in reversed(range(len(sizes))):
        current.append(i)
        ran += durations[i]
        held += sizes[i]
        if ran >= cycle_s or held >= cap_bytes:
            buckets.append(current)
            current, ran, held = [], 0.0, 0
    if current:
        buckets.append(current)
    return buckets


@dataclass(frozen=True)
class Timeline:
    backward_s: float
    comm_s: float      # sum of the buckets' communication
    exposed_s: float   # communication still running when backward ends
    buckets: int


def bucket_timeline(workload: Workload, cap_bytes: int, cost: Callable[[float], float],
                    byte_scale: float = 1.0, cycle_s: float = 0.0) -> Timeline:
    """``cost(bytes)``: seconds of one bucket's exchange. ``cap_bytes`` 0: no overlap, one
    exchange of everything after backward. ``byte_scale``: bytes on the wire per gradient
    byte (compression). ``cycle_s`` > 0: Horovod's fusion cycle (:func:`fusion_buckets`)."""
    sizes = [layer.params * workload.element_size for layer in workload.layers]
    timeline = workload.backward_timeline()  # (layer, finished at), last layer first
    done = dict(timeline)
    bwd = max(done.values())
    if cap_bytes <= 0:
        c = cost(sum(sizes) * byte_scale)
        return Timeline(bwd, c, c, 1)
    end, total = 0.0, 0.0
    if cycle_s > 0:
        durations = [0.0] * len(sizes)
        before = 0.0
        for i, t in timeline:
            durations[i], before = t - before, t
        order = fusion_buckets(sizes, durations, cap_bytes, cycle_s)
    else:
        order = assign_buckets(sizes, cap_bytes)
    for bucket in order:
        ready = max(done[i] for i in bucket)
        c = cost(sum(sizes[i] for i in bucket) * byte_scale)
        end = max(end, ready) + c
        total += c
    return Timeline(bwd, total, max(0.0, end - bwd), len(order))
