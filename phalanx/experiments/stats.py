"""Statistics over repeated seeds: mean, standard deviation, Student-t 95% intervals, a
paired t-test, and the verdict rule every experiment states (no SciPy: the t distribution
comes from the regularized incomplete beta function)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

RULE = ("Verdict rule: a claim **holds** only if the claimed ordering holds with "
        "non-overlapping 95% confidence intervals (Student t over seeds), or with a paired "
        "t-test over the same seeds at p < 0.05 (two-sided); it **does not hold** only if "
        "the opposite ordering is significant by the same test; otherwise it is "
        "**inconclusive**. One seed is always inconclusive for a noisy quantity.")

HOLDS, FAILS, INCONCLUSIVE = "holds", "does not hold", "inconclusive"


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    # the continued fraction converges fast for x < (a+1)/(a+b+2); use symmetry otherwise
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))  # P(T > |t|)
    return 1.0 - tail if t >= 0 else tail


def t_ppf(p: float, df: float) -> float:
    """The quantile: t with P(T <= t) = p (bisection on the monotone CDF)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_ppf: p = {p} must be in (0, 1)")
    if p < 0.5:
        return -t_ppf(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Summary:
    """Mean, sample standard deviation and the 95% Student-t interval of ``n`` values
    (``low``/``high`` are NaN for fewer than two values: no interval from one seed)."""

    n: int
    mean: float
    sd: float
    low: float
    high: float

    def fmt(self, spec: str = ".4f") -> str:
        if self.n < 2:
            return format(self.mean, spec)
        return f"{self.mean:{spec}} ± {self.sd:{spec}}"

    def fmt_ci(self, spec: str = ".4f") -> str:
        if self.n < 2:
            return "—"
        return f"[{self.low:{spec}}, {self.high:{spec}}]"


def summarize(values: Sequence[float], level: float = 0.95) -> Summary:
    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        raise ValueError("summarize: no values")
    mean = sum(xs) / n
    if n < 2:
        return Summary(n, mean, float("nan"), float("nan"), float("nan"))
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_ppf(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return Summary(n, mean, sd, mean - half, mean + half)


@dataclass(frozen=True)
class PairedTest:
    """Two-sided paired t-test of a - b over the same seeds."""

    n: int
    mean_diff: float
    t: float
    p: float


def paired_t(a: Sequence[float], b: Sequence[float]) -> PairedTest:
    if len(a) != len(b):
        raise ValueError(f"paired_t: {len(a)} values against {len(b)}")
    diffs = [float(x) - float(y) for x, y in zip(a, b)]
    n = len(diffs)
    if n < 2:
        return PairedTest(n, diffs[0] if diffs else 0.0, float("nan"), 1.0)
    s = summarize(diffs)
    if s.sd == 0.0:  # every seed moved the same way by the same amount (exact quantities)
        t = 0.0 if s.mean == 0.0 else math.copysign(math.inf, s.mean)
    else:
        t = s.mean / (s.sd / math.sqrt(n))
    p = 1.0 if t == 0.0 else 2.0 * (1.0 - t_cdf(abs(t), n - 1))
    return PairedTest(n, s.mean, t, p)


@dataclass(frozen=True)
class Verdict:
    """The outcome of one comparison "``better`` > ``other``" and the test that decided it."""

    word: str  # HOLDS, FAILS or INCONCLUSIVE
    basis: str  # which test decided, with its numbers

    @property
    def holds(self) -> bool | None:
        return {HOLDS: True, FAILS: False}.get(self.word)


def compare_higher(better: Sequence[float], other: Sequence[float], *, paired: bool = True,
                   alpha: float = 0.05) -> Verdict:
    """Does ``better`` exceed ``other``? Non-overlapping 95% intervals first, then (when
    both come from the same seeds) a paired t-test; the opposite ordering, significant
    by either, is a "does not hold"."""
    a, b = summarize(better), summarize(other)
    if a.n >= 2 and b.n >= 2:
        if a.low > b.high:
            return Verdict(HOLDS, f"95% intervals apart: {a.fmt_ci()} > {b.fmt_ci()}")
        if b.low > a.high:
            return Verdict(FAILS, f"95% intervals apart, the other way: {a.fmt_ci()} < "
                           f"{b.fmt_ci()}")
    if paired and len(better) == len(other) and len(better) >= 2:
        test = paired_t(better, other)
        basis = (f"paired t-test over {test.n} seeds: mean difference {test.mean_diff:+.4f}, "
                 f"t = {test.t:.2f}, p = {test.p:.3f}")
        if test.p < alpha:
            return Verdict(HOLDS if test.mean_diff > 0 else FAILS, basis)
        return Verdict(INCONCLUSIVE, basis + " (intervals overlap)")
    if a.n < 2 or b.n < 2:
        return Verdict(INCONCLUSIVE, "one seed: no interval")
    return Verdict(INCONCLUSIVE, f"95% intervals overlap: {a.fmt_ci()} vs {b.fmt_ci()}")


def compare_lower(better: Sequence[float], other: Sequence[float], *, paired: bool = True,
                  alpha: float = 0.05) -> Verdict:
    """Is ``better`` below ``other`` (a loss)? :func:`compare_higher` on the negated values,
    its basis stated in the values themselves."""
    a, b = summarize(better), summarize(other)
    if a.n >= 2 and b.n >= 2:
        if a.high < b.low:
            return Verdict(HOLDS, f"95% intervals apart: {a.fmt_ci()} < {b.fmt_ci()}")
        if b.high < a.low:
            return Verdict(FAILS, f"95% intervals apart, the other way: {a.fmt_ci()} > "
                           f"{b.fmt_ci()}")
    v = compare_higher([-x for x in better], [-x for x in other], paired=paired, alpha=alpha)
    if v.basis.startswith("paired"):  # the difference better - other, not its negation
        test = paired_t(better, other)
        basis = (f"paired t-test over {test.n} seeds: mean difference {test.mean_diff:+.4f}, "
                 f"t = {test.t:.2f}, p = {test.p:.3f}")
        return Verdict(v.word, basis + (" (intervals overlap)" if v.word == INCONCLUSIVE
                                        else ""))
    if v.basis.startswith("95% intervals overlap"):
        return Verdict(v.word, f"95% intervals overlap: {a.fmt_ci()} vs {b.fmt_ci()}")
    return v


def combine(verdicts: Sequence[Verdict | str]) -> str:
    """A claim made of several orderings (verdicts or their words) holds if every one
    holds and fails if any one fails significantly; anything else is inconclusive."""
    words = [v if isinstance(v, str) else v.word for v in verdicts]
    if words and all(w == HOLDS for w in words):
        return HOLDS
    if FAILS in words:
        return FAILS
    return INCONCLUSIVE


def any_of(verdicts: Sequence[Verdict | str]) -> str:
    """"A or B": holds if one holds, fails only if every one fails."""
    words = [v if isinstance(v, str) else v.word for v in verdicts]
    if HOLDS in words:
        return HOLDS
    if words and all(w == FAILS for w in words):
        return FAILS
    return INCONCLUSIVE
