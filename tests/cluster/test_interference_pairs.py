"""Pairwise interference (model/interference.py): the pair table and its model, the
``interference`` placement, and the event engine pricing each neighbour by its pair."""

from __future__ import annotations

import json
import statistics

import pytest

from phalanx.cluster.core.allocator import ClusterState, Placement
from phalanx.cluster.core.jobs import JobSpec
from phalanx.cluster.core.topology import uniform
from phalanx.cluster.model.interference import (
    CoLocation,
    Pair,
    PairTable,
    fit_pairs,
    gavel_table,
    held_out_errors,
    job_class,
    kind_of,
    load_table,
    table_from_json,
)
from phalanx.cluster.policies.placement_catalog import make_placement
from phalanx.errors import ConfigError, DataError

HOT, COLD = "hot-single-1", "cold-single-1"


def table(hot_hot: float = 0.5, cold_cold: float = 0.98, hot_cold: float = 0.9,
          cold_hot: float = 0.7) -> PairTable:
    """Two classes on one core: two hot jobs halve each other, two cold ones barely
    notice; beside a hot job a cold one keeps 0.7, the hot one 0.9."""
    classes = {HOT: {"model": "hot", "strategy": "single", "workers": 1},
               COLD: {"model": "cold", "strategy": "single", "workers": 1}}
    return PairTable(classes, [Pair("core", HOT, HOT, hot_hot, hot_hot),
                               Pair("core", COLD, COLD, cold_cold, cold_cold),
                               Pair("core", HOT, COLD, hot_cold, cold_hot)], "test")


def spec(i: int, kind: str, gpus: int = 1) -> JobSpec:
    return JobSpec(i, f"j{i}", 0.0, gpus, 100.0, 100.0, kind.split("-")[0], kind=kind)


def place_two(kind: str, co: CoLocation) -> tuple[int, int]:
    """Two 1-GPU jobs of ``kind`` on one server of two 2-device switches: the switches
    (pinned cores) they land on."""
    topo = uniform(1, 1, 1, 4, switches=2)
    cluster = ClusterState(topo)
    policy = make_placement("interference", co=co)
    first = policy.place(spec(0, kind), cluster)
    cluster.allocate(0, first)
    cluster.holders[0] = spec(0, kind)
    second = policy.place(spec(1, kind), cluster)
    return topo.device_switch[first.devices[0]], topo.device_switch[second.devices[0]]


def test_jobs_that_slow_each_other_are_placed_apart_and_quiet_ones_packed() -> None:
    co = CoLocation(table())
    a, b = place_two(HOT, co)
    assert a != b                    # kept 0.5 each: apart
    a, b = place_two(COLD, co)
    assert a == b                    # kept 0.98 each: packed on one switch
    # the same cold pair made hot in the table moves apart: the table decides, not a rule
    a, b = place_two(COLD, CoLocation(table(cold_cold=0.6)))
    assert a != b


def test_interference_placement_weighs_what_it_takes_from_its_neighbour() -> None:
    """A cold job beside a hot one keeps 0.7 there; the cost counts both sides: (1 - 0.7)
    for itself + (1 - 0.9) taken from the hot one = 0.4 GPUs' worth; on an empty switch
    nothing: it goes there."""
    co = CoLocation(table())
    topo = uniform(1, 1, 1, 4, switches=2)
    cluster = ClusterState(topo)
    policy = make_placement("interference", co=co)
    hot = policy.place(spec(0, HOT), cluster)
    cluster.allocate(0, hot)
    cluster.holders[0] = spec(0, HOT)
    cold = spec(1, COLD)
    beside = [d for d in cluster.free_devices(0) if topo.device_switch[d] ==
              topo.device_switch[hot.devices[0]]]
    cost = policy.cost(cold, Placement((beside[0],), ((0, 1),)), cluster)
    assert cost == pytest.approx((1 - 0.7) + (1 - 0.9))
    p = policy.place(cold, cluster)
    assert topo.device_switch[p.devices[0]] != topo.device_switch[hot.devices[0]]


def test_interference_placement_needs_a_table() -> None:
    with pytest.raises(ConfigError, match="--interference-pairs"):
        make_placement("interference")


def test_co_location_load_adds_each_neighbours_demand() -> None:
    """Measured levels: one hot neighbour on my core halves me (load 1), two give a third
    (load 2), as time-sharing one core does; a server-level neighbour costs nothing when
    the table measured no server level."""
    co = CoLocation(table())
    assert co.load(HOT, [(HOT, 1, 0)], 2, 4) == pytest.approx(1.0)
    assert co.load(HOT, [(HOT, 1, 0), (HOT, 1, 0)], 2, 4) == pytest.approx(2.0)
    assert co.load(HOT, [(HOT, 0, 1)], 2, 4) == 0.0
    assert co.load(COLD, [(HOT, 1, 0)], 2, 4) == pytest.approx(1 / 0.7 - 1)


def test_pair_model_recovers_a_rank_one_table_and_predicts_a_held_out_pair() -> None:
    """kept = 1 / (1 + s_a p_b) exactly: the fit recovers every pair, and a pair left out
    is predicted from the others within 1%."""
    s = {"a": 0.2, "b": 0.6, "c": 1.0, "d": 0.4}
    p = {"a": 1.5, "b": 0.5, "c": 1.0, "d": 2.0}
    kept = {("core", x, y): 1 / (1 + s[x] * p[y]) for x in s for y in s}
    model = fit_pairs(kept, iters=500)
    for (lvl, x, y), v in kept.items():
        assert model.predict(x, y, lvl) == pytest.approx(v, rel=1e-3)
    classes = {k: {} for k in s}
    pairs = [Pair("core", x, y, kept[("core", x, y)], kept[("core", y, x)])
             for i, x in enumerate(s) for y in list(s)[i:]]
    errors = held_out_errors(PairTable(classes, pairs))
    assert len(errors) == 16
    assert max(e["error"] for e in errors) < 0.01


def test_gavel_pairs_load_and_their_held_out_error_is_reported(data_dir) -> None:
    t = gavel_table(data_dir)
    assert len(t.classes) == 7 and len(t.pairs) >= 20
    kept = t.kept()
    # ResNet-50 beside ResNet-50 on one V100 keeps well under its solo rate
    assert kept[("device", "ResNet-50-single-1", "ResNet-50-single-1")] < 0.8
    errs = [e["error"] for e in held_out_errors(t)]
    assert 0.0 < statistics.median(errs) < 0.5


def test_job_classes_and_the_file_round_trip(tmp_path) -> None:
    assert job_class("gpt", "asp", 2) == "gpt-ps-2"
    assert job_class("mlp", "fsdp", 4) == "mlp-sync-4"
    assert kind_of("cifar10") == "ResNet-18-single-1" and kind_of("x", "mlp-sync-2") == \
        "mlp-sync-2"
    with pytest.raises(ConfigError, match="unknown strategy"):
        job_class("mlp", "nope", 1)
    path = tmp_path / "interference.json"
    table().save(path)
    back = load_table(path)
    assert back.kept() == table().kept()


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(format="x"), "not a phalanx interference table"),
    (lambda d: d.update(version=9), "version 9"),
    (lambda d: d["pairs"][0].update(level="rack"), r"pairs\[0\].level"),
    (lambda d: d["pairs"][0].update(a="nobody"), r"pairs\[0\].a names no class"),
    (lambda d: d["pairs"][1].update(kept_b=0), r"pairs\[1\].kept_b must be a number"),
    (lambda d: d["pairs"][1].update(kept_a="0.5"), r"pairs\[1\].kept_a"),
    (lambda d: d["pairs"][2].update(repeats=0), r"pairs\[2\].repeats"),
    (lambda d: d.update(pairs=[]), "non-empty list"),
])
def test_a_bad_table_is_refused_in_one_line(change, message) -> None:
    d = json.loads(json.dumps(table().to_json()))
    change(d)
    with pytest.raises(DataError, match=message):
        table_from_json(d)


def test_the_event_engine_prices_each_neighbour_by_its_pair(perf) -> None:
    """Two hot jobs of work 100 on one switch (one core): each keeps 0.5, both end at 200;
    on two switches (no server level measured) at 100; a hot and a cold job on one switch
    end at the times each side of their pair gives."""
    from phalanx.cluster.model.perf import PerfModel, PerfOptions
    from phalanx.cluster.policies import FIFO, Pack, Spread
    from phalanx.cluster.sim.event import Simulator

    co = CoLocation(table())
    pm = PerfModel(perf.profiles, perf.pollux, PerfOptions(cpu=False), co=co)
    topo = uniform(1, 1, 1, 4, switches=2, cpu_cores=16)
    job = lambda i, kind: JobSpec(i, f"j{i}", 0.0, 1, 100.0, 100.0, "ResNet-18",  # noqa: E731
                                  cpu_per_gpu=1, kind=kind)
    both = Simulator(topo, [job(0, HOT), job(1, HOT)], FIFO(), Pack(), pm).run()
    assert [j.end for j in both.jobs] == pytest.approx([200.0, 200.0])
    apart = Simulator(topo, [job(0, HOT), job(1, HOT)], FIFO(), Spread(), pm).run()
    assert [j.end for j in apart.jobs] == pytest.approx([100.0, 100.0])
    # hot keeps 0.9 beside cold, cold 0.7: hot ends at 100/0.9; cold then has
    # 100 - 0.7 * 111.1 = 22.2 left alone: ends at 133.3
    mixed = Simulator(topo, [job(0, HOT), job(1, COLD)], FIFO(), Pack(), pm).run()
    assert mixed.jobs[0].end == pytest.approx(100 / 0.9)
    assert mixed.jobs[1].end == pytest.approx(100 / 0.9 + (100 - 0.7 * 100 / 0.9))


def test_simulate_flags_interference_pairs(tmp_path, capsys) -> None:
    from phalanx.cli import main

    base = ["simulate", "--trace", "synthetic:jobs=30,rate=400,median=600,max_gpus=2",
            "--cluster", "uniform:1,1,2,4", "--no-progress", "--out", str(tmp_path / "o")]
    assert main([*base, "--placement", "interference"]) == 2
    err = capsys.readouterr().err
    assert "--interference-pairs" in err and err.count("\n") == 1
    (tmp_path / "bad.json").write_text('{"format": "phalanx-interference", "version": 1}')
    assert main([*base, "--interference-pairs", str(tmp_path / "bad.json")]) == 2
    assert "'classes' must map" in capsys.readouterr().err
    path = tmp_path / "t.json"
    table().save(path)
    assert main([*base, "--placement", "interference", "--interference-pairs", "gavel"]) == 0
    assert main([*base, "--placement", "interference", "--interference-pairs",
                 str(path)]) == 0
