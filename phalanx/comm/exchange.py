"""The compression layer as the strategies see it: :class:`Compression` wraps a codec (or
PowerSGD) with error feedback, and offers the two exchanges phalanx has:

* :meth:`Compression.mean_` — the mean over an allreduce group (sync buckets, averaging
  deltas), with the compressor's own correct collective (see :mod:`phalanx.comm.compress`);
* :meth:`Compression.encode` / :func:`~phalanx.comm.compress.decode_payload` — one
  message to one peer (parameter-server pushes and pulls).

:func:`mean_bytes` is the exact number of bytes all ranks together send for one
:meth:`~Compression.mean_` call; the tests hold the byte counters to it.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Sequence

import torch

from phalanx.comm.allreduce import AllReduce
from phalanx.comm.compress import (
    CompressSpec,
    ErrorFeedback,
    HalfPrecision,
    PullDeltas,
    RandK,
    codec_flags,
    kept,
    make_codec,
    parse_compress,
)
from phalanx.comm.powersgd import PowerSGD, factor_numel


class Compression:
    """``--compress`` + ``--error-feedback`` for one sender (a worker)."""

    def __init__(self, spec: CompressSpec, error_feedback: bool = True, seed: int = 0) -> None:
        self.spec = spec
        self.feedback = ErrorFeedback(error_feedback and spec.lossy)
        self.seed = seed
        self.powersgd = (PowerSGD(spec.rank, spec.start, spec.warm, seed=seed)
                         if spec.name == "powersgd" else None)
        self.codec = make_codec(spec) if self.powersgd is None else None
        self._calls: dict[object, int] = defaultdict(int)  # per key: shared randk seeds

    @classmethod
    def from_config(cls, cfg) -> Compression:
        return cls(parse_compress(cfg.compress), cfg.error_feedback, cfg.seed)

    @property
    def active(self) -> bool:
        return self.spec.lossy

    @property
    def flags(self) -> int:
        return codec_flags(self.spec)

    # ---- one message to one peer ---------------------------------------------------------

    def encode(self, x: torch.Tensor, key: object, seed: int = 0) -> torch.Tensor:
        """The wire tensor for ``x`` (+ the residual kept under ``key``); ``seed`` picks
        rand-k's indices (the receiver reads it off the message)."""
        y = self.feedback.add(key, x)
        t = self.codec.encode(y, seed) if isinstance(self.codec, RandK) else self.codec.encode(y)
        self.feedback.keep(key, y, self.codec.decode(t, y.numel()))
        return t

    # ---- the mean over an allreduce group ------------------------------------------------

    def mean_(self, flat: torch.Tensor, shapes: Sequence[torch.Size], allreduce: AllReduce,
              world: int, key: object) -> torch.Tensor:
        """Replace ``flat`` by the (compressed) mean of every rank's ``flat``."""
        if world == 1 or not self.active:
            allreduce(flat)
            return flat.div_(world)
        if self.powersgd is not None and not self.powersgd.compressing(key):
            return self.powersgd.mean_(flat, shapes, allreduce, world, key)  # plain start-up
        x = self.feedback.add(key, flat)
        if self.powersgd is not None:
            mean = self.powersgd.mean_(x.clone(), shapes, allreduce, world, key)
            sent = mean  # PowerSGD's error is against the aggregate (as the paper / torch)
        else:
            mean, sent = self._codec_mean(x, allreduce, world, key)
        self.feedback.keep(key, x, sent)
        return flat.copy_(mean)

    def _codec_mean(self, x: torch.Tensor, allreduce: AllReduce, world: int,
                    key: object) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean over the group, this rank's own decoded contribution)."""
        codec, n = self.codec, x.numel()
        if isinstance(codec, HalfPrecision):
            # divide first, as DDP's fp16 hook does: the half-precision sum cannot overflow
            h = codec.encode(x / world)
            sent = h.float() * world
            allreduce(h)
            return h.float(), sent
        if isinstance(codec, RandK):
            # every rank draws the same indices (seed, key, call): only the values travel
            self._calls[key] += 1
            # (crc32, not hash(): str hashes differ between processes)
            seed = zlib.crc32(f"{self.seed}:{key}:{self._calls[key]}".encode()) & 0x7FFF_FFFF
            idx = codec.indices(seed, n)
            vals = x[idx].contiguous()
            sent = torch.zeros(n)
            sent[idx] = vals
            allreduce(vals)
            mean = torch.zeros(n)
            mean[idx] = vals / world
            return mean, sent
        # top-k, int8: not summable compressed; all-gather the wire tensors, decode each
        t = codec.encode(x)
        mine = codec.decode(t, n)
        parts = allreduce.all_gather(t)
        total = torch.zeros(n)
        for part in parts:  # rank order on every rank: identical replicas
            total += codec.decode(part, n)
        return total.div_(world), mine


# ---- exact traffic ---------------------------------------------------------------------

def allreduce_total(nbytes: int, world: int) -> int:
    """Bytes all ranks send for one allreduce of ``nbytes`` (ring, native's estimate and
    main-node alike: 2 X (N-1))."""
    return 2 * nbytes * (world - 1) if world > 1 and nbytes else 0


def all_gather_total(nbytes: int, world: int, allreduce: str) -> int:
    """Bytes all ranks send for one all-gather of ``nbytes`` per rank: ring / native
    N (N-1) X; main node: every rank sends X to rank 0, which sends N X to every other."""
    if world == 1:
        return 0
    if allreduce == "main":
        return (world - 1) * nbytes + (world - 1) * world * nbytes
    return world * (world - 1) * nbytes


def mean_bytes(spec: CompressSpec, shapes: Sequence[torch.Size], world: int,
               allreduce: str, step: int = 0) -> int:
    """Bytes all ranks send for one :meth:`Compression.mean_` over tensors of ``shapes``
    (``step``: the call's index, for PowerSGD's uncompressed start-up)."""
    n = sum(int(torch.Size(s).numel()) for s in shapes)
    if spec.name == "none" or (spec.name == "powersgd" and step < spec.start):
        return allreduce_total(4 * n, world)
    if spec.name in ("fp16", "bf16"):
        return allreduce_total(2 * n, world)
    if spec.name == "randk":
        return allreduce_total(4 * kept(spec.ratio, n), world)
    if spec.name == "powersgd":
        p, q, raw = factor_numel([torch.Size(s) for s in shapes], spec.rank)
        return sum(allreduce_total(4 * k, world) for k in (raw, p, q) if k)
    return all_gather_total(make_codec(spec).payload_bytes(n), world, allreduce)


# ---- parameter server: what a worker and a shard need -------------------------------------

def compression_for(cfg) -> Compression | None:
    """A PS worker's compression of its pushes (and its request for compressed pulls)."""
    comp = Compression.from_config(cfg)
    return comp if comp.active else None


def pull_deltas_for(cfg) -> PullDeltas | None:
    """A shard's compressed pull replies (None: plain pulls)."""
    spec = parse_compress(cfg.compress)
    return PullDeltas(make_codec(spec)) if spec.lossy else None
