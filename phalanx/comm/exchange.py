"""The compression layer as the strategies see it: :class:`Compression` wraps a codec (or
PowerSGD) with error feedback, and offers the two exchanges phalanx has:

* :meth:`Compression.mean_` — the mean over an allreduce group (sync buckets, averaging
  deltas), with the compressor's own correct collective (see :mod:`phalanx.comm.compress`);
* :meth:`Compression.encode` / :func:`~phalanx.comm.compress.decode_payload` — one
  message to one peer (parameter-server pushes and pulls).

:func:`mean_bytes` is the exact number of bytes all ranks together send for one
:meth:`~Compression.mean_` call; the tests hold the byte counters to it.

Non-finite safety (docs/compression.md): before anything is encoded, the input plus its
residual is screened. NaN or inf anywhere: the message is *skipped* (a PS push is replaced
by a SKIPPED notice the shard counts as rejected; in a group this rank contributes zeros,
so the collective still runs on every rank) and the residual is left as it was. Finite but
beyond the codec's limit (fp16's 65504): the values are *clipped* to it and the excess stays
in the residual, so it arrives over the next messages. :class:`Screened` counts both;
:data:`SKIP_STREAK` skips in a row on one key end the run with one line naming the cause.
"""

from __future__ import annotations

import json
import math
import zlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from phalanx.comm.allreduce import AllReduce
from phalanx.comm.compress import (
    CompressSpec,
    ErrorFeedback,
    HalfPrecision,
    RandK,
    codec_flags,
    kept,
    make_codec,
    parse_compress,
)
from phalanx.comm.powersgd import PowerSGD, factor_numel
from phalanx.comm.ps_payload import PullDeltas
from phalanx.errors import PhalanxError

SKIP_STREAK = 10  # skipped messages in a row on one key: the run has diverged
POWERSGD_LIMIT = 2.0**100  # P = M Q sums a row of M: room for 2^27 elements per row


class NonFiniteGradients(PhalanxError):
    """The same key's input was NaN or inf :data:`SKIP_STREAK` times in a row."""


@dataclass
class Screened:
    """What the screen before encoding did, over a sender's life."""

    skipped: int = 0  # messages (pushes, group contributions) skipped: NaN or inf
    clipped: int = 0  # messages clipped to the codec's limit
    values_clipped: int = 0  # values in them beyond the limit


def _need(cond: bool, what: str) -> None:
    """A compression state read back from a checkpoint: ValueError naming what is wrong."""
    if not cond:
        raise ValueError(f"compression state: {what}")


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
        self.screened = Screened()
        self.lr_hint = ""  # " (--lr X with --rule R)": for the divergence message
        self._streak: dict[object, int] = defaultdict(int)  # per key: skips in a row
        self.sizes: dict[object, int] = {}  # per key, in first-use order: values compressed

    @classmethod
    def from_config(cls, cfg) -> Compression:
        comp = cls(parse_compress(cfg.compress), cfg.error_feedback, cfg.seed)
        if cfg.lr is not None:  # (None: a configuration not validated yet)
            comp.lr_hint = f" (--lr {cfg.lr:g} with --rule {cfg.rule})"
        return comp

    @property
    def active(self) -> bool:
        return self.spec.lossy

    @property
    def flags(self) -> int:
        return codec_flags(self.spec)

    # ---- one message to one peer ---------------------------------------------------------

    @property
    def limit(self) -> float:
        """The largest magnitude one message carries."""
        return POWERSGD_LIMIT if self.codec is None else self.codec.limit

    def screen(self, key: object, x: torch.Tensor, limit: float,
               what: str = "") -> tuple[torch.Tensor | None, torch.Tensor]:
        """(``x`` + the residual under ``key``, the same clipped to ``limit``); the first
        is None when it holds NaN or inf (counted; the residual stays as it was). Raises
        :class:`NonFiniteGradients` at the :data:`SKIP_STREAK`-th skip in a row (``what``
        names the key in its message)."""
        self.sizes.setdefault(key, x.numel())
        y = self.feedback.add(key, x)
        lo, hi = torch.aminmax(y) if y.numel() else (torch.zeros(()), torch.zeros(()))
        lo, hi = float(lo), float(hi)  # sync point: one scalar pair per message
        if not (math.isfinite(lo) and math.isfinite(hi)):
            self.screened.skipped += 1
            self._streak[key] += 1
            if self._streak[key] >= SKIP_STREAK:
                raise NonFiniteGradients(
                    f"training diverged: {what or repr(key)} held NaN or inf in "
                    f"{self._streak[key]} messages in a row; --compress {self.spec} skipped "
                    "each one (counted; the error-feedback residual is intact), so nothing "
                    f"was learnt: the learning rate{self.lr_hint} is probably too high, or "
                    "the data holds non-finite values")
            return None, torch.zeros_like(x)
        self._streak[key] = 0
        if max(-lo, hi) <= limit:
            return y, y
        self.screened.clipped += 1
        self.screened.values_clipped += int((y.abs() > limit).sum())
        return y, y.clamp(-limit, limit)

    def encode(self, x: torch.Tensor, key: object, seed: int = 0) -> torch.Tensor | None:
        """The wire tensor for ``x`` (+ the residual kept under ``key``); ``seed`` picks
        rand-k's indices (the receiver reads it off the message). None: skipped (NaN or
        inf in ``x``; see :meth:`screen`)."""
        y, c = self.screen(key, x, self.codec.limit, f"the gradient for shard {key}")
        if y is None:
            return None
        t = self.codec.encode(c, seed) if isinstance(self.codec, RandK) else self.codec.encode(c)
        self.feedback.keep(key, y, self.codec.decode(t, y.numel()))
        return t

    # ---- checkpoints: what compression carries from one step to the next ------------------

    def state_tensors(self) -> list[torch.Tensor]:
        """This sender's state, as the checkpoint (and its gather over the group) holds it:
        fixed-shape tensors, the same shapes on every rank of a group (every rank compresses
        the same keys in the same order; a residual that is absent travels as zeros with
        its flag off). Layout: keys (JSON, uint8); per key (present, skips in a row, rand-k
        calls, PowerSGD steps, warm Q count); the counters (skipped, clipped, values
        clipped, dropped); each key's residual; with PowerSGD its RandomState (MT19937
        words; position, cached Gaussian) and each warm key's Q (shapes, values)."""
        keys = list(self.sizes)
        psgd = self.powersgd
        q_memory = psgd.q_memory if psgd is not None else {}
        table = torch.tensor([[int(k in self.feedback.residual), self._streak.get(k, 0),
                               self._calls.get(k, 0), psgd.iters.get(k, 0) if psgd else 0,
                               len(q_memory.get(k, ()))] for k in keys],
                             dtype=torch.int64).reshape(len(keys), 5)
        sc = self.screened
        out = [torch.tensor(bytearray(json.dumps(keys).encode()), dtype=torch.uint8), table,
               torch.tensor([sc.skipped, sc.clipped, sc.values_clipped, self.feedback.dropped],
                            dtype=torch.int64)]
        for k in keys:
            r = self.feedback.residual.get(k)
            out.append(r.detach().to("cpu", copy=True) if r is not None
                       else torch.zeros(self.sizes[k]))
        if psgd is not None:
            _, words, pos, has_gauss, gauss = psgd.rng.get_state()
            out += [torch.from_numpy(words.astype(np.int64)),
                    torch.tensor([pos, has_gauss, gauss], dtype=torch.float64)]
            for k in keys:
                for q in q_memory.get(k, ()):
                    out += [torch.tensor(q.shape, dtype=torch.int64),
                            q.detach().to("cpu", copy=True)]
        return out

    def load_state(self, tensors: list[torch.Tensor], device: torch.device | str = "cpu") -> None:
        """Back from :meth:`state_tensors`, onto ``device`` (read from a checkpoint: every
        shape, dtype and count is checked; raises ValueError naming what does not fit)."""
        _need(len(tensors) >= 3, "too short")
        head, table, counters, *rest = tensors
        _need(head.dtype == torch.uint8 and head.dim() == 1, "bad keys")
        try:
            keys = json.loads(bytes(head.tolist()).decode())
        except (ValueError, UnicodeDecodeError):
            keys = None
        _need(isinstance(keys, list) and all(isinstance(k, (int, str)) for k in keys)
              and len(set(keys)) == len(keys), "bad keys")
        _need(table.dtype == torch.int64 and tuple(table.shape) == (len(keys), 5)
              and bool((table >= 0).all()), "bad key table")
        _need(counters.dtype == torch.int64 and tuple(counters.shape) == (4,)
              and bool((counters >= 0).all()), "bad counters")
        _need(len(rest) >= len(keys) and all(r.dtype == torch.float32 and r.dim() == 1
                                             for r in rest[:len(keys)]), "bad residuals")
        psgd = self.powersgd
        _need(psgd is not None or not bool(table[:, 3:].any()), "PowerSGD state without "
              "--compress powersgd")
        rows = table.tolist()
        self.sizes = {k: int(r.numel()) for k, r in zip(keys, rest)}
        self.feedback.residual = {k: r.to(device, copy=True)
                                  for k, r, row in zip(keys, rest, rows) if row[0]}
        self._streak = defaultdict(int, {k: row[1] for k, row in zip(keys, rows)})
        self._calls = defaultdict(int, {k: row[2] for k, row in zip(keys, rows)})
        sc = counters.tolist()
        self.screened = Screened(sc[0], sc[1], sc[2])
        self.feedback.dropped = sc[3]
        rest = rest[len(keys):]
        if psgd is None:
            _need(not rest, "too long")
            return
        self._load_powersgd(psgd, rest, keys, rows, device)

    @staticmethod
    def _load_powersgd(psgd: PowerSGD, rest: list[torch.Tensor], keys: list,
                       table: list[list[int]], device: torch.device | str) -> None:
        """PowerSGD's part of :meth:`load_state`: its generator, step counts and warm Q."""
        _need(len(rest) >= 2 and rest[0].dtype == torch.int64 and tuple(rest[0].shape) == (624,)
              and rest[1].dtype == torch.float64 and tuple(rest[1].shape) == (3,),
              "bad PowerSGD random state")
        pos, has_gauss, gauss = rest[1].tolist()
        try:
            psgd.rng.set_state(("MT19937", rest[0].numpy().astype(np.uint32), int(pos),
                                int(has_gauss), gauss))
        except (ValueError, TypeError):
            _need(False, "bad PowerSGD random state")
        psgd.iters = defaultdict(int, {k: row[3] for k, row in zip(keys, table)})
        qs = rest[2:]
        psgd.q_memory = {}
        for k, row in zip(keys, table):
            mine = []
            for _ in range(row[4]):
                _need(len(qs) >= 2, "missing warm Q")
                shape, q, qs = qs[0], qs[1], qs[2:]
                _need(shape.dtype == torch.int64 and shape.tolist() == list(q.shape)
                      and q.dtype == torch.float32, "bad warm Q")
                mine.append(q.to(device, copy=True))
            if mine:
                psgd.q_memory[k] = mine
        _need(not qs, "too long")

    # ---- the mean over an allreduce group ------------------------------------------------

    def mean_(self, flat: torch.Tensor, shapes: Sequence[torch.Size], allreduce: AllReduce,
              world: int, key: object) -> torch.Tensor:
        """Replace ``flat`` by the (compressed) mean of every rank's ``flat``."""
        if world == 1 or not self.active:
            allreduce(flat)
            return flat.div_(world)
        # skipped (NaN / inf): this rank contributes zeros, so every rank still runs the
        # same collectives; a clipped value's excess stays in the residual
        what = f"bucket {key} of the gradient" if isinstance(key, int) else f"the {key}"
        x, c = self.screen(key, flat, self.group_limit(world), what)
        if self.powersgd is not None:
            # the plain start-up steps included: their error is the clipped excess only
            start_up = not self.powersgd.compressing(key)
            mean = self.powersgd.mean_(c.clone(), shapes, allreduce, world, key)
            sent = c if start_up else mean  # PowerSGD's error is against the aggregate
        else:
            mean, sent = self._codec_mean(c, allreduce, world, key)
        if x is not None:
            self.feedback.keep(key, x, sent)
        return flat.copy_(mean)

    def group_limit(self, world: int) -> float:
        """The largest magnitude of one rank's contribution to a group mean. Half precision
        is summed in half precision: N values, each rounded up by at most eps/2 when encoded
        and again by every partial sum, stay below the max when each is at most
        max / (N (1 + N eps)) (eps: 2^-10 for fp16, 2^-7 for bf16). A float32 sum of N
        values of at most 2 limit / N = 2^127 / N cannot overflow either."""
        if isinstance(self.codec, HalfPrecision):
            eps = torch.finfo(self.codec.dtype).eps
            return self.codec.limit / (1 + world * eps)
        return self.limit * 2 / world

    def _codec_mean(self, x: torch.Tensor, allreduce: AllReduce, world: int,
                    key: object) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean over the group, this rank's own decoded contribution)."""
        codec, n = self.codec, x.numel()
        if isinstance(codec, HalfPrecision):
            # divide first, as DDP's fp16 hook does: with x within group_limit the
            # half-precision sum cannot overflow
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


def group_screened(comp: Compression | None) -> Screened:
    """Every rank's :class:`Screened` counts summed (a bookkeeping collective every rank
    calls, not counted in the traffic, like the byte totals; none without compression,
    which every rank's configuration agrees on)."""
    if comp is None or not comp.active:
        return Screened()
    mine = comp.screened
    t = torch.tensor([mine.skipped, mine.clipped, mine.values_clipped], dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return Screened(*(int(v) for v in t.tolist()))


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
