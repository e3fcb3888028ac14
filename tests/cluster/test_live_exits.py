"""What a gang's exit means (``live/exits.py:classify``), every case as a value: the live
loop only applies the outcome."""

from __future__ import annotations

import pytest

from phalanx.cluster.live.exits import Exit, Outcome, classify
from phalanx.runtime.preempt import PREEMPTED_EXIT

Out = Outcome


@pytest.mark.parametrize(("stop", "rc", "lost", "summary", "restarts", "want"), [
    ("", 0, False, True, 0, Out.DONE),                   # it finished
    ("", 1, False, False, 0, Out.RESTART),               # it failed: a restart is left
    ("", 1, False, False, 1, Out.FAILED),                # ...none is left
    ("", 1, True, False, 1, Out.LOST),                   # its server went: not its failure
    ("", 1, True, True, 0, Out.DONE),                    # ...but it had finished
    ("lost", PREEMPTED_EXIT, False, False, 1, Out.LOST),  # stopped for a lost server
    ("preempt", PREEMPTED_EXIT, False, False, 0, Out.PREEMPTED),
    ("preempt", -9, False, False, 0, Out.PREEMPTED),     # killed before its checkpoint
    ("preempt", PREEMPTED_EXIT, False, True, 0, Out.DONE),   # stopped as it finished
    ("preempt", 0, False, False, 0, Out.DONE),           # finished before the signal came
    ("timeout", -15, False, False, 0, Out.TIMEOUT),
    ("timeout", 1, True, False, 0, Out.TIMEOUT),         # a timeout is never a lost server
])
def test_every_exit_has_one_outcome(stop, rc, lost, summary, restarts, want):
    assert classify(Exit(stop, rc, lost, summary), restarts, max_restarts=1) is want
