"""PowerSGD (Vogels et al. 2019): rank-r gradient compression inside an allreduce group.

For each gradient tensor M (viewed as rows x rest) that is worth it, one power iteration
per step: P = M Q, allreduce P, orthogonalise P, Q = M^T P, allreduce Q, M ~ P Q^T / N.
Tensors where (n + m) r * 2 >= n m (biases, tiny layers) are allreduced uncompressed.
With error feedback, the input is the gradient plus last step's error, and the error kept
is the input minus the aggregated approximation (for the uncompressed tensors too).

The semantics are those of PyTorch's DDP hook
(``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook``), which the tests use as
the oracle: the same minimum compression rate (2), the same grouping of tensors by shape,
Q drawn from ``numpy.random.RandomState(seed).randint(1e9)`` once per bucket per step
(without warm start), Gram-Schmidt for rank <= 2 and QR above, and ``start`` steps of
plain allreduce first (torch's ``start_powerSGD_iter``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import torch

from phalanx.comm.allreduce import AllReduce

MIN_COMPRESSION_RATE = 2


def orthogonalize_(m: torch.Tensor, eps: float = 0.0) -> None:
    """Orthonormal columns for a batch of matrices (b, n, r), in place."""
    rank = m.shape[2]
    if rank <= 2:
        for i in range(rank):  # Gram-Schmidt
            col = m[:, :, i : i + 1]
            norm = torch.norm(col, dim=1, keepdim=True) + eps
            # a zero column (every rank skipped a non-finite input) stays zero, not 0/0
            col /= torch.where(norm > 0, norm, torch.ones_like(norm))
            if i + 1 < rank:
                rest = m[:, :, i + 1 :]
                rest -= torch.sum(col * rest, dim=1, keepdim=True) * col
    else:
        m.copy_(torch.linalg.qr(m).Q)


def should_compress(n: int, m: int, rank: int) -> bool:
    return (n + m) * rank * MIN_COMPRESSION_RATE < n * m


def plan(shapes: Sequence[torch.Size], rank: int) -> list[bool]:
    """Which tensors of a bucket are compressed."""
    out = []
    for s in shapes:
        n = s[0] if len(s) else 1
        m = max(1, int(np.prod(s[1:]))) if len(s) > 1 else 1
        out.append(should_compress(n, m, min(n, m, rank)))
    return out


def factor_numel(shapes: Sequence[torch.Size], rank: int) -> tuple[int, int, int]:
    """(P elements, Q elements, uncompressed elements) that one bucket's step allreduces."""
    p = q = raw = 0
    for s, c in zip(shapes, plan(shapes, rank)):
        numel = int(np.prod(s)) if len(s) else 1
        if c:
            n = s[0]
            m = numel // n
            r = min(n, m, rank)
            p, q = p + n * r, q + m * r
        else:
            raw += numel
    return p, q, raw


class PowerSGD:
    """One bucket's PowerSGD state lives under its key; :meth:`mean_` is the collective."""

    name = "powersgd"

    def __init__(self, rank: int, start: int = 0, warm: bool = False, seed: int = 0,
                 eps: float = 0.0) -> None:
        self.rank, self.start, self.warm, self.eps = rank, start, warm, eps
        self.rng = np.random.RandomState(seed)
        self.q_memory: dict[object, list[torch.Tensor]] = {}
        self.iters: dict[object, int] = defaultdict(int)

    def compressing(self, key: object) -> bool:
        return self.iters[key] >= self.start

    def mean_(self, flat: torch.Tensor, shapes: Sequence[torch.Size], allreduce: AllReduce,
              world: int, key: object) -> torch.Tensor:
        """Replace ``flat`` (the concatenated tensors of ``shapes``) by the approximate mean
        over the group; returns it. Every rank must call with the same shapes and keys."""
        self.iters[key] += 1
        if self.iters[key] <= self.start:
            allreduce(flat)
            return flat.div_(world)
        views, offset = [], 0
        for s in shapes:
            n = int(np.prod(s)) if len(s) else 1
            views.append(flat[offset : offset + n].view(s))
            offset += n
        which = plan(shapes, self.rank)
        raw = [v for v, c in zip(views, which) if not c]
        groups: dict[torch.Size, list[torch.Tensor]] = defaultdict(list)
        for v, c in zip(views, which):
            if c:
                matrix = v.view(v.shape[0], -1)
                groups[matrix.shape].append(matrix)
        matrices = [m.unsqueeze(0) for ms in groups.values() for m in ms]
        ranks = [min(m.shape[1], m.shape[2], self.rank) for m in matrices]
        qs = self._initial_qs(matrices, ranks, key)
        ps = [torch.bmm(m, q) for m, q in zip(matrices, qs)]
        # uncompressed tensors: one flat allreduce
        if raw:
            buf = torch.cat([v.reshape(-1) for v in raw])
            allreduce(buf)
            buf.div_(world)
            o = 0
            for v in raw:
                v.copy_(buf[o : o + v.numel()].view_as(v))
                o += v.numel()
        if not matrices:
            return flat
        # P: allreduce (sum), orthogonalise; Q = M^T P: allreduce, / N; M ~ P Q^T
        p_flat = _allreduce_all(ps, allreduce)
        for p in p_flat:
            orthogonalize_(p, self.eps)
        for m, p, q in zip(matrices, p_flat, qs):
            torch.bmm(m.transpose(1, 2), p, out=q)
        q_flat = _allreduce_all(qs, allreduce)
        for q in q_flat:
            q.div_(world)
        for m, p, q in zip(matrices, p_flat, q_flat):
            torch.bmm(p, q.transpose(1, 2), out=m)
        if self.warm:
            self.q_memory[key] = [q.clone() for q in q_flat]
        return flat

    def _initial_qs(self, matrices: list[torch.Tensor], ranks: list[int],
                    key: object) -> list[torch.Tensor]:
        if self.warm and key in self.q_memory:
            qs = self.q_memory[key]
            for q in qs:
                orthogonalize_(q, self.eps)
            return qs
        # one seed per bucket and step from the shared RandomState: every rank draws the
        # same Q without sending it
        gen = torch.Generator().manual_seed(int(self.rng.randint(1_000_000_000)))
        qs = []
        for m, r in zip(matrices, ranks):
            q = torch.randn(1, m.shape[2], r, generator=gen, dtype=m.dtype)
            orthogonalize_(q, self.eps)
            qs.append(q)
        return qs


def _allreduce_all(tensors: list[torch.Tensor], allreduce: AllReduce) -> list[torch.Tensor]:
    """Sum every tensor over the group with one flat allreduce; returns views of the sum."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    allreduce(flat)
    out, o = [], 0
    for t in tensors:
        out.append(flat[o : o + t.numel()].view_as(t))
        o += t.numel()
    return out
