"""``phalanx schedule --pin-cores`` (local engine): each PCIe switch's slots run on one core
of this machine, a rank's process (and what it starts) on its switch's core."""

from __future__ import annotations

import os
import sys
import time

import pytest

from phalanx.cli import main
from phalanx.cluster.core.topology import uniform
from phalanx.cluster.live.engines.base import Gang, RankSlot
from phalanx.cluster.live.engines.local import LocalExecutor, core_pins

CORES = sorted(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(len(CORES) < 2, reason="needs 2 cores to pin apart")

# the process prints its cores, then those of a child it starts (inherited)
SHOW = ("import os, subprocess, sys; print(sorted(os.sched_getaffinity(0)), flush=True); "
        "subprocess.run([sys.executable, '-c', 'import os; "
        "print(sorted(os.sched_getaffinity(0)))'])")


def test_each_switch_is_one_core_round_robin() -> None:
    topo = uniform(1, 1, 2, 4, switches=2)   # 4 switches of 2 devices
    pins = core_pins(topo, [5, 7])
    assert [sorted(pins[d]) for d in range(8)] == [[5], [5], [7], [7], [5], [5], [7], [7]]


@needs_two
@pytest.mark.parametrize("devices, core", [((0, 1), 0), ((2,), 1)])
def test_a_gang_runs_on_its_switch_core_and_its_children_too(tmp_path, devices, core) -> None:
    topo = uniform(1, 1, 1, 4, switches=2)
    ex = LocalExecutor(sys.executable, pins=core_pins(topo, CORES[:2]))
    slot = RankSlot(0, 0, "s0", devices, devices)
    log = tmp_path / "a.log"
    ex.start(Gang("a", 0, ("-c", SHOW), (slot,), False, False, log, tmp_path / "r.jsonl"))
    end = time.monotonic() + 60
    while ex.poll("a") is None:
        assert time.monotonic() < end
        time.sleep(0.02)
    assert log.read_text().split("\n")[:2] == [f"[{CORES[core]}]"] * 2


def test_pin_cores_is_refused_off_the_local_engine(capsys) -> None:
    assert main(["schedule", "--jobs", "x.yaml", "--engine", "ray", "--pin-cores"]) == 2
    assert "--pin-cores: only with --engine local" in capsys.readouterr().err
    assert main(["schedule", "--jobs", "x.yaml", "--placement", "interference"]) == 2
    assert "--interference-pairs" in capsys.readouterr().err
    assert main(["schedule", "--jobs", "x.yaml", "--interference-pairs", "t.json"]) == 2
    assert "--interference-pairs: --placement pack does not use it" in \
        capsys.readouterr().err


@needs_two
def test_a_topology_with_fewer_switches_than_cores_is_told_which_cores_idle(capsys) -> None:
    """uniform:1,1,1,4 is one switch: every slot on one core, the other idle (the live
    experiment once ran so); the engine says so as it starts."""
    import contextlib

    from phalanx.cluster.live.engines.base import EngineOptions
    from phalanx.cluster.live.engines.local import local_engine

    with contextlib.ExitStack() as stack:
        ex = local_engine(uniform(1, 1, 1, 4, switches=1), EngineOptions(pin_cores=True), stack)
    assert set(ex.pins.values()) == {frozenset({CORES[0]})}
    out = capsys.readouterr().out
    assert f"--pin-cores: 1 PCIe switch(es) on core(s) {CORES[0]}; core(s)" in out
    assert "idle" in out
    local_engine(uniform(1, 1, 1, 4, switches=2), EngineOptions(pin_cores=True),
                 contextlib.ExitStack())
    assert "idle" not in capsys.readouterr().out or len(CORES) > 2
