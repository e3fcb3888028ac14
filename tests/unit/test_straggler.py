"""The straggler emulation (``--slow-workers``): a rank F times slower sleeps F - 1 times
its typical compute phase, and one phase the OS held up does not become a long stall."""

import time

from phalanx.parallel.base import STRAGGLER_WINDOW, Straggler


def _phase(s: Straggler, compute_s: float) -> float:
    """One compute phase of ``compute_s``, then the straggler's sleep: that sleep's length."""
    s.start()
    time.sleep(compute_s)
    t = time.perf_counter()
    s.finish()
    return time.perf_counter() - t


def test_sleeps_factor_minus_one_times_the_median_phase():
    s = Straggler(5.0)
    steady = [_phase(s, 0.01) for _ in range(4)]
    assert all(x >= 4 * 0.01 for x in steady), steady      # 4 x a phase of >= 10 ms
    # a phase held up 0.2 s: the sleep follows the median (~10 ms), not 4 x 0.2 s
    assert _phase(s, 0.2) < 0.4
    assert STRAGGLER_WINDOW >= 5


def test_factor_one_never_sleeps():
    s = Straggler(1.0)
    assert _phase(s, 0.02) < 0.01
