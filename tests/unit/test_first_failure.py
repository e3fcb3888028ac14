"""The first rank of a gang to fail claims it (phalanx.runtime.first_failure)."""

from __future__ import annotations

import subprocess
import sys
import time

from phalanx.runtime import first_failure
from phalanx.runtime.first_failure import cause

CLAIMER = """
import os, sys, time
from phalanx.runtime import first_failure
first_failure.arm(sys.argv[1], int(sys.argv[2]))
while not os.path.exists(sys.argv[3]):     # every process ready: claim together
    time.sleep(0.001)
first_failure.claim(int(sys.argv[4]))
"""


def test_of_racing_processes_exactly_one_claim_is_written_whole(tmp_path):
    path, go = tmp_path / "job.0.failed", tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", CLAIMER, str(path), str(rank), str(go),
                               str(code)])
             for rank, code in ((0, 2), (1, 4), (2, -9), (3, 2))]
    time.sleep(1.0)
    go.touch()
    assert [p.wait(30) for p in procs] == [0, 0, 0, 0]
    claim = first_failure.read(path)
    assert claim in {(0, 2), (1, 4), (2, -9), (3, 2)}, path.read_text()
    assert path.read_text() == f"{claim[0]} {claim[1]}\n"


def test_a_later_claim_changes_nothing(tmp_path, monkeypatch):
    path = tmp_path / "job.0.failed"
    monkeypatch.setattr(first_failure, "_armed", None)   # restored after the test
    first_failure.arm(str(path), 1)
    first_failure.claim(4)
    first_failure.arm(str(path), 0)
    first_failure.claim(2)
    assert first_failure.read(path) == (1, 4)


def test_nothing_armed_claims_nothing_and_a_bad_claim_reads_as_none(tmp_path, monkeypatch):
    monkeypatch.setattr(first_failure, "_armed", None)
    first_failure.claim(2)
    first_failure.arm("", 3)
    first_failure.claim(2)
    assert list(tmp_path.iterdir()) == []
    p = tmp_path / "c"
    assert first_failure.read(p) is None               # no claim
    for text in ("", "1", "a 2", "1 2 3", "-1 2"):     # empty: killed between create and write
        p.write_text(text)
        assert first_failure.read(p) is None, text
    p.write_text("3 -9\n")
    assert first_failure.read(p) == (3, -9)


def test_the_cause_among_ranks_seen_ended_together():
    assert cause((), (1, 4)) is None
    # one rank seen: the poll's order already tells
    assert cause(((0, 2),), (1, 4)) == (0, 2)
    # rank 0 failed on rank 1's reset connection; both seen at one poll: the claimant
    assert cause(((0, 2), (1, 4)), (1, 4)) == (1, 4)
    # no claim (or a claim from a rank not seen ended): the lowest rank
    assert cause(((0, 2), (1, 4)), None) == (0, 2)
    assert cause(((0, 2), (1, 4)), (3, 2)) == (0, 2)
    # rank 2 was SIGKILLed from outside (it could not claim): its peers' errors, and the
    # claim the first of them made, are consequences
    assert cause(((0, 2), (1, 2), (2, -9)), (1, 2)) == (2, -9)
    # a rank that killed itself with a signal after claiming is the claimant, not "killed"
    assert cause(((0, 2), (1, -9)), (1, -9)) == (1, -9)
    assert cause(((0, -15), (1, -9)), (1, -9)) == (0, -15)
    # rank 0 claimed and aborted itself (-6); rank 1, SIGKILLed, could not claim: the
    # outside kill is the cause (a claimant's own signal does not make it "killed")
    assert cause(((0, -6), (1, -9)), (0, -6)) == (1, -9)
