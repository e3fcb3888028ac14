"""The live learner's link level (live/colocation.py, issue 49): on a cluster whose servers
are machines of their own (an existing Ray or Slurm cluster: ``links``), a job across
servers shares their links with every other job across servers on one of them; the
learner tells that apart from sharing a core when the schedule shows both, and learns no
link level on one machine (no link there to share)."""

from __future__ import annotations

from pathlib import Path

import pytest
from colocation_events import write

from phalanx.cluster.core.topology import uniform
from phalanx.cluster.live.colocation import learn, observe

TOPO = uniform(1, 1, 2, 2, switches=1)    # servers 0 (devices 0, 1) and 1 (devices 2, 3)
SYNC = "mlp-sync-2"
KINDS = {"a": SYNC, "b": SYNC}
CORE_X, LINK_X = 1 / 9, 1.0               # a core neighbour: kept 0.9; a link one: 0.5


def schedule(tmp_path: Path) -> Path:
    """a across both servers (devices 0, 2) for 60 s: alone 0-20 at 100/s; b across them
    too (1, 3) 20-40: on a's switches and its links, a runs at 100 / (1 + 1/9 + 1); b on
    server 0 alone (device 1) 40-60: a's switch only, a at 100 / (1 + 1/9)."""
    both = 100 / (1 + CORE_X + LINK_X)
    core = 100 / (1 + CORE_X)
    jobs = {"a": {"placements": [[0, [0, 2]]], "end": 60,
                  "rate": [(0, 20, 100), (20, 40, both), (40, 60, core)]},
            "b": {"placements": [[20, [1, 3]], [40, [1]]], "stops": [40], "end": 60,
                  "rate": [(20, 40, both), (40, 60, core)]}}
    write(tmp_path, jobs, 60.0, rank=0)
    return tmp_path


def test_on_separate_machines_the_link_and_the_core_are_learned_apart(tmp_path) -> None:
    seen = observe(schedule(tmp_path), TOPO, KINDS, links=True)
    assert set(seen["a"]) == {((), (), ()), ((SYNC,), (), (SYNC,)), ((SYNC,), (), ())}
    kept = learn(seen, KINDS).kept()
    # least squares pulled 0.1 s' worth toward no load: within 0.5%
    assert kept[("core", SYNC, SYNC)] == pytest.approx(0.9, rel=5e-3)
    assert kept[("link", SYNC, SYNC)] == pytest.approx(0.5, rel=5e-3)


def test_on_one_machine_no_link_level_is_learned(tmp_path) -> None:
    """The same schedule with the servers on one machine (the local engine): a key has no
    link level, and the link's cost is read as the core's, the only thing shared."""
    seen = observe(schedule(tmp_path), TOPO, KINDS)
    assert set(seen["a"]) == {((), ()), ((SYNC,), ())}
    table = learn(seen, KINDS)
    assert table.levels() == ["core"]


def test_a_neighbour_always_on_the_same_servers_and_links_is_learned_at_level_link(
        tmp_path) -> None:
    """a and b across both servers together (one switch each, their links) in every
    context they share, as two jobs across the same hosts always are: the rows cannot tell
    the core's load from the link's, and the whole of it is the link's (as the profiler's
    level link measures it), not split evenly by the fit's penalty (it was: 0.67 and 0.67
    for a true 0.5 on a live schedule of test hosts)."""
    jobs = {"a": {"placements": [[0, [0, 2]]], "end": 40,
                  "rate": [(0, 20, 100), (20, 40, 100 / (1 + LINK_X))]},
            "b": {"placements": [[20, [1, 3]]], "end": 40,
                  "rate": [(20, 40, 100 / (1 + LINK_X))]}}
    write(tmp_path, jobs, 40.0, rank=0)
    seen = observe(tmp_path, TOPO, KINDS, links=True)
    assert set(seen["a"]) == {((), (), ()), ((SYNC,), (), (SYNC,))}
    table = learn(seen, KINDS)
    assert table.levels() == ["link"]
    assert table.kept()[("link", SYNC, SYNC)] == pytest.approx(0.5, rel=5e-3)


@pytest.mark.parametrize("device, alone_s, beside_s", [(1, 10.0 - 1.5, 20 - 15.5),
                                                      (2, 20 - 1.5, None)])
def test_a_neighbour_still_starting_is_neither_beside_a_job_nor_not(
        tmp_path, device, alone_s, beside_s) -> None:
    """b is placed at 10 s and trains from 15 s (its first train event at 15.5: before it,
    imports and its group, no link used). On a's server (device 1) a's spans from 10 to
    15.5 are dropped, neither alone nor beside b (they were counted beside b: on test
    hosts a sync MLP beside another on a shaped link then kept 0.53, not 0.50); on the
    other server (device 2) b shares nothing with a, and its start-up drops none of a's
    spans."""
    jobs = {"a": {"placements": [[0, [0]]], "end": 20, "rate": [(0, 20, 100)]},
            "b": {"placements": [[10, [device]]], "end": 20, "rate": [(15, 20, 100)]}}
    write(tmp_path, jobs, 20.0, rank=0)
    seen = observe(tmp_path, TOPO, KINDS, links=True)["a"]
    assert seen[((), (), ())].span == pytest.approx(alone_s)
    beside = seen.get(((SYNC,), (), ()))
    assert (beside.span if beside else None) == pytest.approx(beside_s)
