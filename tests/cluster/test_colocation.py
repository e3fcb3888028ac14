"""Interference measured from a live schedule's own files (live/colocation.py): contexts
from the state's placements and stops, rates from the jobs' train events, the pair table
learned from them, and the live table that refits as the schedule runs."""

from __future__ import annotations

import pytest
from colocation_events import write

from phalanx.cluster.core.topology import uniform
from phalanx.cluster.live.colocation import LiveCoLocation, learn, merged, observe
from phalanx.cluster.model.interference import CoLocation, Pair, PairTable

TOPO = uniform(1, 1, 1, 4, switches=2)      # devices 0,1 on switch 0; 2,3 on switch 1
KINDS = {"a": "hot-single-1", "b": "hot-single-1", "c": "cold-single-1"}


def test_two_jobs_on_one_core_then_alone_give_the_pair_each_side(tmp_path) -> None:
    """a alone 0-20 s at 100/s; b joins a's switch 20-40 s: both at 50/s; a alone again
    40-60 s: the learned table holds hot beside hot kept 0.5."""
    jobs = {"a": {"placements": [[0, [0]]], "end": 60, "rate": [(0, 20, 100), (20, 40, 50),
                                                                 (40, 60, 100)]},
            "b": {"placements": [[20, [1]]], "end": 40, "rate": [(20, 40, 50)]}}
    write(tmp_path, jobs, 60.0)
    seen = observe(tmp_path, TOPO, KINDS)
    ctx = seen["a"]
    assert set(ctx) == {((), ()), (("hot-single-1",), ())}
    assert ctx[((), ())].rate == pytest.approx(100)
    assert ctx[(("hot-single-1",), ())].rate == pytest.approx(50)
    # b has no alone time: its solo rate comes from a's (the same class)
    table = learn(seen, KINDS)
    assert len(table.pairs) == 1
    p = table.pairs[0]
    assert (p.level, p.a, p.b) == ("core", "hot-single-1", "hot-single-1")
    # (a least-squares fit pulled 0.1 s' worth toward no load: within 0.2%)
    assert p.kept_a == pytest.approx(0.5, rel=2e-3) and p.kept_b == p.kept_a


def test_a_neighbour_on_the_other_switch_is_the_server_level(tmp_path) -> None:
    jobs = {"a": {"placements": [[0, [0]]], "end": 40, "rate": [(0, 20, 100), (20, 40, 90)]},
            "c": {"placements": [[0, [2]]], "stops": [10], "rate": [(0, 10, 80)]},
            "b": {"placements": [[20, [3]]], "end": 40, "rate": [(20, 40, 90)]}}
    # c: never alone (a runs 0-10 beside it, server level); b beside a 20-40 (server)
    write(tmp_path, jobs, 40.0)
    seen = observe(tmp_path, TOPO, KINDS)
    assert seen["a"][((), ("hot-single-1",))].rate == pytest.approx(90)
    assert seen["a"][((), ("cold-single-1",))].rate == pytest.approx(100)
    assert seen["a"][((), ())].rate == pytest.approx(100)
    table = learn(seen, KINDS)
    kept = table.kept()
    assert kept[("server", "hot-single-1", "hot-single-1")] == pytest.approx(0.9, rel=2e-3)
    # cold was never seen alone (no solo, no prior): its side stands in as hot's
    assert kept[("server", "cold-single-1", "hot-single-1")] == \
        kept[("server", "hot-single-1", "cold-single-1")] == pytest.approx(1.0, abs=1e-3)


def test_a_span_across_a_neighbours_arrival_and_the_warm_up_are_not_counted(tmp_path) -> None:
    """a logs every 0.5 s from 0.5 s; b arrives at 10.25, inside a's 10.0-10.5 span: that
    span is dropped, not split, and so is a's next (10.5-11.0): b was still starting (its
    first train event at 10.75); a's first two spans (0.5-1.5 s) are its start-up."""
    jobs = {"a": {"placements": [[0, [0]]], "end": 20, "rate": [(0, 20, 100)]},
            "b": {"placements": [[10.25, [1]]], "end": 20, "rate": [(10.25, 20, 50)]}}
    write(tmp_path, jobs, 20.0)
    seen = observe(tmp_path, TOPO, KINDS)
    assert seen["a"][((), ())].seconds[-1] == pytest.approx(10.0 - 1.5)
    assert seen["a"][(("hot-single-1",), ())].seconds[-1] == pytest.approx(20 - 11.0)


def test_the_live_table_learns_over_its_prior(tmp_path) -> None:
    prior = PairTable({"hot-single-1": {}, "cold-single-1": {}},
                      [Pair("core", "hot-single-1", "hot-single-1", 0.9, 0.9),
                       Pair("core", "cold-single-1", "hot-single-1", 0.8, 0.7)], "prior")
    co = LiveCoLocation(prior, tmp_path, TOPO, KINDS, refresh_s=0.0)
    co.refresh()     # nothing written yet: the prior's
    assert co.kept("hot-single-1", "hot-single-1", "core") == pytest.approx(0.9)
    jobs = {"a": {"placements": [[0, [0]]], "end": 60, "rate": [(0, 20, 100), (20, 40, 50),
                                                                 (40, 60, 100)]},
            "b": {"placements": [[20, [1]]], "end": 40, "rate": [(20, 40, 50)]}}
    write(tmp_path, jobs, 60.0)
    co.refresh()
    # load 1 measured over a's 20 s and b's 18.5 s (after its two start-up spans), pulled
    # toward the prior's 1/0.9 - 1 by 5 s' worth
    x = (38.5 * 1.0 + 5 * (1 / 0.9 - 1)) / 43.5
    assert co.kept("hot-single-1", "hot-single-1", "core") == pytest.approx(1 / (1 + x),
                                                                            rel=1e-3)
    assert co.kept("cold-single-1", "hot-single-1", "core") == pytest.approx(0.8)
    both = merged(prior, co.learned)
    assert len(both.pairs) == 2 and "prior" in both.source


def test_no_state_or_no_pair_gives_nothing(tmp_path) -> None:
    assert observe(tmp_path, TOPO, KINDS) == {}
    write(tmp_path, {"a": {"placements": [[0, [0]]], "end": 10, "rate": [(0, 10, 100)]}},
          10.0)
    assert learn(observe(tmp_path, TOPO, KINDS), KINDS) is None


def test_several_neighbours_at_once_are_told_apart_by_adding_their_loads(tmp_path) -> None:
    """a alone at 100/s; beside b on its core (50/s: load 1); then b on its core and c on
    the other switch (40/s: load 1.5, so c's server-level load is 0.5, kept 0.67); c's
    own pair comes from c's solo in the prior table, b's side from a's class."""
    kinds = {"a": "hot-single-1", "b": "hot-single-1", "c": "cold-single-1"}
    jobs = {"a": {"placements": [[0, [0]]], "end": 60,
                  "rate": [(0, 20, 100), (20, 40, 50), (40, 60, 40)]},
            "b": {"placements": [[20, [1]]], "end": 60, "rate": [(20, 40, 50), (40, 60, 40)]},
            "c": {"placements": [[40, [2]]], "end": 60, "rate": [(40, 60, 72)]}}
    write(tmp_path, jobs, 60.0)
    table = learn(observe(tmp_path, TOPO, kinds), kinds)
    kept = table.kept()
    assert kept[("core", "hot-single-1", "hot-single-1")] == pytest.approx(0.5, rel=1e-2)
    assert kept[("server", "hot-single-1", "cold-single-1")] == pytest.approx(2 / 3, rel=1e-2)
    # c was never alone and there is no prior: its side is not learned (a's stands in)
    prior = CoLocation(PairTable({"cold-single-1": {"solo": 80.0}, "hot-single-1": {}},
                                 [Pair("server", "cold-single-1", "hot-single-1", 1.0, 1.0)]))
    table = learn(observe(tmp_path, TOPO, kinds), kinds, prior=prior)
    p = next(p for p in table.pairs if {p.a, p.b} == {"hot-single-1", "cold-single-1"})
    cold = p.kept_a if p.a == "cold-single-1" else p.kept_b
    # 72/s against its table solo 80/s beside two hot jobs on the server: load 1/9 shared
    assert 0.8 < cold < 1.0
