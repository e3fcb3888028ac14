"""The statistics behind every verdict: t distribution against table values, intervals,
the paired test, and the verdict rule on synthetic seeds."""

import math

import pytest

from phalanx.experiments.stats import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    betainc,
    combine,
    compare_higher,
    paired_t,
    summarize,
    t_cdf,
    t_ppf,
)


@pytest.mark.parametrize("p, df, expected", [
    (0.975, 1, 12.7062047), (0.975, 2, 4.30265273), (0.975, 4, 2.77644511),
    (0.975, 10, 2.22813885), (0.975, 30, 2.04227246), (0.95, 2, 2.91998558),
    (0.995, 5, 4.03214298), (0.9, 20, 1.32534071),
])
def test_t_quantile_matches_tables(p, df, expected):
    assert t_ppf(p, df) == pytest.approx(expected, rel=1e-6)
    assert t_ppf(1 - p, df) == pytest.approx(-expected, rel=1e-6)


def test_t_cdf_known_values():
    assert t_cdf(0.0, 3) == pytest.approx(0.5)
    assert t_cdf(1.0, 1) == pytest.approx(0.75)  # Cauchy: 1/2 + atan(1)/pi
    assert t_cdf(2.0, 5) == pytest.approx(0.94903026, rel=1e-7)
    assert t_cdf(-2.0, 5) == pytest.approx(1 - 0.94903026, rel=1e-6)
    # large df tends to the normal distribution
    assert t_cdf(1.959964, 1e6) == pytest.approx(0.975, abs=1e-5)
    assert betainc(2.0, 3.0, 0.4) == pytest.approx(0.5248, abs=1e-4)  # 1 - sum binomial terms


def test_summary_interval():
    s = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert s.n == 5 and s.mean == 3.0 and s.sd == pytest.approx(math.sqrt(2.5))
    half = 2.77644511 * math.sqrt(2.5) / math.sqrt(5)
    assert (s.low, s.high) == (pytest.approx(3 - half), pytest.approx(3 + half))
    one = summarize([0.8])
    assert one.mean == 0.8 and math.isnan(one.low) and one.fmt_ci() == "—"


def test_paired_t_against_hand_computation():
    # differences 1, 2, 3, 4: mean 2.5, sd 1.2910, t = 3.873 with 3 df -> p = 0.0305
    test = paired_t([2, 4, 6, 8], [1, 2, 3, 4])
    assert test.t == pytest.approx(3.872983, rel=1e-5)
    assert test.p == pytest.approx(0.030466, rel=1e-3)


def test_clear_win_holds_by_intervals():
    v = compare_higher([0.86, 0.87, 0.865, 0.868, 0.862], [0.80, 0.81, 0.805, 0.79, 0.802])
    assert v.word == HOLDS and "intervals apart" in v.basis and v.holds is True


def test_clear_loss_does_not_hold():
    v = compare_higher([0.70, 0.71, 0.69, 0.705, 0.70], [0.85, 0.86, 0.855, 0.85, 0.86])
    assert v.word == FAILS and v.holds is False


def test_overlapping_intervals_are_inconclusive():
    # the DC-ASGD numbers: spread across seeds larger than the gap
    v = compare_higher([0.862, 0.867, 0.862], [0.830, 0.851, 0.871])
    assert v.word == INCONCLUSIVE and "p =" in v.basis and v.holds is None


def test_paired_test_finds_a_consistent_small_win_the_intervals_miss():
    # seeds differ a lot from each other, but the same seed always favours `better`
    base = [0.70, 0.80, 0.75, 0.85, 0.78]
    better = [b + 0.01 + 0.001 * i for i, b in enumerate(base)]
    v = compare_higher(better, base)
    assert v.word == HOLDS and v.basis.startswith("paired t-test")
    assert compare_higher(better, base, paired=False).word == INCONCLUSIVE


def test_one_seed_is_inconclusive_and_combine():
    assert compare_higher([0.9], [0.1]).word == INCONCLUSIVE
    win = compare_higher([1.0, 1.1, 1.05], [0.0, 0.1, 0.05])
    loss = compare_higher([0.0, 0.1, 0.05], [1.0, 1.1, 1.05])
    tie = compare_higher([0.5, 0.6, 0.4], [0.5, 0.4, 0.6])
    assert combine([win, win]) == HOLDS
    assert combine([win, tie]) == INCONCLUSIVE
    assert combine([win, loss]) == FAILS
    assert combine([]) == INCONCLUSIVE


def test_compare_lower_states_its_basis_in_the_values():
    from phalanx.experiments.stats import compare_lower

    low, high = [2.0, 2.01, 2.02], [2.5, 2.52, 2.51]
    v = compare_lower(low, high)
    assert v.word == HOLDS and "< [" in v.basis and "-2" not in v.basis
    assert compare_lower(high, low).word == FAILS
    # a small, consistent win the intervals miss: the paired difference is negative
    a, b = [2.0, 2.3, 2.1], [2.01, 2.31, 2.11]
    v = compare_lower(a, b)
    assert v.word == HOLDS and "mean difference -0.0100" in v.basis
    assert compare_lower([2.0, 2.3, 2.1], [2.2, 2.0, 2.3]).word == INCONCLUSIVE
