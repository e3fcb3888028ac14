"""L-BFGS over scalars: the coordinator's half of Sandblaster L-BFGS.

The shards hold the vectors (parameters x, gradient g, direction d and the history pairs
s_i = t_i d_i, y_i = g_{i+1} - g_i); the coordinator holds only their dot products. The
two-loop recursion is linear in the vectors it touches, so it can be run on coefficients
over the basis ``[s_0 .. s_{h-1}, y_0 .. y_{h-1}, g]`` given the basis' Gram matrix
("vector-free L-BFGS", Chen et al. 2014): every ``v.q`` is ``G[v] @ c`` and every
``q -= a * y_i`` is ``c[y_i] -= a``. The shards then form ``d = sum_j c_j b_j`` on their
slices. Per iteration each shard returns O(m) partial dot products (the new pair and the
new gradient against the stored pairs) and receives 2m + 1 coefficients: the traffic
through the coordinator is O(shards x history) scalars, never O(parameters).

The arithmetic follows ``torch.optim.LBFGS`` step for step (pair accepted when
``y.s > 1e-10``, ``H_diag = y.s / y.y``, the same two loops), so that with the same line
search the two produce the same iterates up to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CURVATURE_EPS = 1e-10  # torch.optim.LBFGS: a pair is kept only when y.s > 1e-10


@dataclass
class GradientDots:
    """The partial sums a shard returns after a new gradient g was accepted (summed over
    shards, except ``max_abs_g``, their maximum). ``s``, ``y``: the candidate pair formed
    from the previous step (zeros on the first gradient); ``*_hist``: against the h pairs
    stored before this one."""

    gg: float
    g_s: float
    g_y: float
    ss: float
    sy: float
    yy: float
    abs_sum_g: float
    max_abs_g: float
    g_s_hist: list[float]
    g_y_hist: list[float]
    s_s_hist: list[float]
    s_y_hist: list[float]
    y_s_hist: list[float]
    y_y_hist: list[float]

    HEAD = 8  # scalars before the six per-pair lists

    @staticmethod
    def length(h: int) -> int:
        return GradientDots.HEAD + 6 * h

    @classmethod
    def combine(cls, partials: list[torch.Tensor], h: int) -> GradientDots:
        """Add the shards' partial vectors (the max entry is a maximum, not a sum)."""
        stacked = torch.stack([p.double() for p in partials])
        total = stacked.sum(0)
        total[7] = stacked[:, 7].max()
        v = total.tolist()
        head, rest = v[: cls.HEAD], v[cls.HEAD :]
        lists = [rest[i * h : (i + 1) * h] for i in range(6)]
        return cls(*head, *lists)


class GramLBFGS:
    """The history's Gram matrix and the two-loop recursion on coefficients."""

    def __init__(self, history: int) -> None:
        if history < 1:
            raise ValueError("history must be >= 1")
        self.m = history
        self.ss = torch.zeros(0, 0, dtype=torch.float64)  # s_i . s_j
        self.sy = torch.zeros(0, 0, dtype=torch.float64)  # s_i . y_j
        self.yy = torch.zeros(0, 0, dtype=torch.float64)  # y_i . y_j
        self.g_s = torch.zeros(0, dtype=torch.float64)  # g . s_i
        self.g_y = torch.zeros(0, dtype=torch.float64)
        self.gg = 0.0
        self.h_diag = 1.0
        self.first = True

    @property
    def pairs(self) -> int:
        return self.ss.shape[0]

    def observe(self, dots: GradientDots) -> bool:
        """Take the dots of a newly accepted gradient; returns whether the candidate pair
        (s, y) joins the history (the shards must do the same: the DIRECTION command says)."""
        accept = not self.first and dots.sy > CURVATURE_EPS
        g_s = torch.tensor(dots.g_s_hist, dtype=torch.float64)
        g_y = torch.tensor(dots.g_y_hist, dtype=torch.float64)
        if accept:
            keep = slice(1, None) if self.pairs == self.m else slice(0, None)
            h = self.pairs
            ss = torch.zeros(h + 1, h + 1, dtype=torch.float64)
            sy, yy = ss.clone(), ss.clone()
            ss[:h, :h], sy[:h, :h], yy[:h, :h] = self.ss, self.sy, self.yy
            new_s_s = torch.tensor(dots.s_s_hist, dtype=torch.float64)  # s_new . s_i
            new_s_y = torch.tensor(dots.s_y_hist, dtype=torch.float64)  # s_new . y_i
            new_y_s = torch.tensor(dots.y_s_hist, dtype=torch.float64)  # y_new . s_i
            new_y_y = torch.tensor(dots.y_y_hist, dtype=torch.float64)
            ss[h, :h] = ss[:h, h] = new_s_s
            yy[h, :h] = yy[:h, h] = new_y_y
            sy[h, :h] = new_s_y  # s_new . y_i
            sy[:h, h] = new_y_s  # s_i . y_new
            ss[h, h], sy[h, h], yy[h, h] = dots.ss, dots.sy, dots.yy
            self.ss, self.sy, self.yy = ss[keep, keep], sy[keep, keep], yy[keep, keep]
            g_s = torch.cat([g_s, torch.tensor([dots.g_s], dtype=torch.float64)])[keep]
            g_y = torch.cat([g_y, torch.tensor([dots.g_y], dtype=torch.float64)])[keep]
            self.h_diag = dots.sy / dots.yy
        self.g_s, self.g_y, self.gg = g_s, g_y, dots.gg
        self.first = False
        return accept

    def gram(self) -> torch.Tensor:
        """Gram matrix of the basis [s_0..s_{h-1}, y_0..y_{h-1}, g]."""
        h = self.pairs
        n = 2 * h + 1
        gm = torch.zeros(n, n, dtype=torch.float64)
        gm[:h, :h] = self.ss
        gm[:h, h : 2 * h] = self.sy
        gm[h : 2 * h, :h] = self.sy.T
        gm[h : 2 * h, h : 2 * h] = self.yy
        gm[:h, -1] = gm[-1, :h] = self.g_s
        gm[h : 2 * h, -1] = gm[-1, h : 2 * h] = self.g_y
        gm[-1, -1] = self.gg
        return gm

    def direction(self) -> tuple[torch.Tensor, float]:
        """Coefficients c of d = sum_j c_j b_j (the two-loop recursion applied to -g), and
        the directional derivative g.d."""
        h = self.pairs
        gm = self.gram()
        c = torch.zeros(2 * h + 1, dtype=torch.float64)
        c[-1] = -1.0  # q = -g
        ro = [1.0 / float(self.sy[i, i]) for i in range(h)]
        al = [0.0] * h
        for i in range(h - 1, -1, -1):
            al[i] = float(gm[i] @ c) * ro[i]  # s_i . q
            c[h + i] -= al[i]  # q -= al_i y_i
        c *= self.h_diag  # r = H_diag q
        for i in range(h):
            be = float(gm[h + i] @ c) * ro[i]  # y_i . r
            c[i] += al[i] - be  # r += (al_i - be_i) s_i
        return c, float(gm[-1] @ c)
