"""The Ray engine's fence without Ray: how long the GCS takes to call a silent node dead
(Ray's health-check arithmetic), the lease rule, and the fence killing a real process
when its questions go unanswered (the live partition test is
tests/cluster/test_ray_live.py::test_a_cut_off_node_and_a_crashed_one_lose_their_job_to_the_others_and_come_back)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from phalanx.cluster.live.engines.ray_cluster import NODES_EVERY_S, HealthCheck, verdict_s
from phalanx.cluster.live.engines.ray_fence import (
    ASKS_PER_LEASE,
    KILL_S,
    Fence,
    Lease,
    dead_rank_ended,
    fenced_after_s,
)

TEST_ENV = {"RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "1500",
            "RAY_health_check_failure_threshold": "4"}


def test_a_silent_node_is_called_dead_after_every_check_ran_out():
    # Ray's defaults: 5 checks of 10 s, 3 s apart (measured: 41.8 s for 4 x 10 s + 3 x 0.5 s)
    assert HealthCheck.from_env({}).silent_s() == (62.0, 65.0)
    assert HealthCheck.from_env({"RAY_health_check_period_ms": "500",
                                 "RAY_health_check_failure_threshold": "4"}).silent_s() \
        == (41.5, 42.0)
    check = HealthCheck.from_env(TEST_ENV)
    assert check == HealthCheck(period_s=0.5, timeout_s=1.5, threshold=4)
    assert check.silent_s() == (7.5, 8.0)
    assert check.fence_s() == 3.75 < check.silent_s()[0]
    assert verdict_s(TEST_ENV) == 8.0 + 2 * NODES_EVERY_S + 2.0
    # a bad value is Ray's default, a threshold below 1 is 1
    assert HealthCheck.from_env({"RAY_health_check_timeout_ms": "soon",
                                 "RAY_health_check_failure_threshold": "0"}) == HealthCheck(
        period_s=3.0, timeout_s=10.0, threshold=1)


def test_the_lease_runs_from_the_last_question_answered_alive():
    rng = random.Random(5)
    for _ in range(200):
        lease = Lease(fence_s=2.0, asked_at=0.0)
        answers = sorted((rng.uniform(0, 20), rng.random() < 0.9) for _ in range(8))
        rng.shuffle(answers)   # answers come back in any order
        for asked, alive in answers:
            lease.answer(asked, alive)
        dead = any(not alive for _, alive in answers)
        last = max([0.0] + [t for t, alive in answers if alive])
        assert lease.dead == dead
        assert lease.asked_at == last
        for now in (last, last + 1.9, last + 2.1, 30.0):
            assert lease.expired(now) == (dead or now - last > 2.0)
    lease = Lease(fence_s=2.0, asked_at=0.0)
    assert lease.why(3.0) == "no word from the cluster for 3.0 s (lease 2 s)"
    lease.answer(2.5, False)
    assert lease.expired(2.6) and lease.why(2.6) == "the cluster called this node dead"


@pytest.fixture
def rank():
    """A real process in its own process group, as a rank runs; killed on the way out."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         start_new_session=True)
    yield p
    if p.poll() is None:
        p.kill()
    p.wait()


def _cutter(p: subprocess.Popen, cuts: list[tuple[float, str]]):
    def cut(why: str) -> None:
        cuts.append((time.monotonic(), why))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
    return cut


@pytest.mark.parametrize("answer", ["none", "dead", "alive"])
def test_the_fence_kills_the_rank_when_the_cluster_is_silent_or_calls_it_dead(rank, answer):
    fence_s = 0.6
    cuts: list[tuple[float, str]] = []
    hang = threading.Event()

    def ask(timeout_s: float) -> bool:
        assert timeout_s == fence_s / 4
        if answer == "none":   # a question that hangs past its timeout (a cut link)
            hang.wait(5)
            raise TimeoutError
        return answer == "alive"

    t0 = time.monotonic()
    fence = Fence(fence_s, ask, _cutter(rank, cuts))
    try:
        rank.wait(timeout=4 if answer != "alive" else 3 * fence_s)
    except subprocess.TimeoutExpired:
        pass
    finally:
        fence.close()
        hang.set()
    if answer == "alive":
        assert rank.poll() is None and not cuts   # the lease was renewed all along
        return
    assert rank.poll() == -signal.SIGKILL
    when, why = cuts[0]
    if answer == "dead":
        assert why == "the cluster called this node dead" and when - t0 < fence_s
    else:
        # the lease ran out: no sooner than fence_s, at most a check's period later (and
        # a loaded machine's scheduling)
        assert why.startswith("no word from the cluster for ")
        assert fence_s < when - t0 < fence_s + fence_s / 8 + 1.0


def test_a_lost_node_s_rank_is_counted_ended_only_once_its_lease_surely_ran_out():
    """The GCS may call a node dead well under the lease after the node last heard "alive"
    (its failed health checks counted across a partition that had healed a moment: chaos
    seed 206 called b dead 1.2 s into a second cut, and S's resumed start ran beside b's
    still-leased rank for 1.5 s). So the scheduler counts a lost node's rank as ended only
    ``fenced_after_s`` after the verdict: every lease whose last "alive" answered a question
    asked before the verdict has expired by then, at whatever phase the checks run."""
    fence = HealthCheck.from_env(TEST_ENV).fence_s()
    wait = fenced_after_s(fence)
    assert wait == pytest.approx(fence * 1.125 + 1.0) and wait == pytest.approx(5.21875)
    rng = random.Random(7)
    every = fence / ASKS_PER_LEASE / 2          # the fence's check cadence
    for _ in range(2000):
        verdict = rng.uniform(0, 20)
        lease = Lease(fence, asked_at=0.0)
        lease.answer(rng.uniform(0, verdict), True)   # the last "alive" came before it
        t = rng.uniform(0, every)                      # the checks' phase
        while not lease.expired(t):
            t += every
        assert t <= verdict + wait - KILL_S + 1e-9, (verdict, lease.asked_at, t)
    # the rule the engine's poll applies to a dead actor's rank: its node called lost 1.2 s
    # ago is not enough (it was, before: the resumed start ran beside the cut-off rank)
    v = verdict_s(TEST_ENV)
    assert not dead_rank_ended(1.2, 1.2, v, fence)
    assert not dead_rank_ended(wait - 0.01, wait, v, fence)
    assert dead_rank_ended(wait, wait, v, fence)
    # no verdict (the node still up): the cluster's own time to reach one, and the lease's
    assert not dead_rank_ended(None, v + wait - 0.01, v, fence)
    assert dead_rank_ended(None, v + wait + 0.01, v, fence)
