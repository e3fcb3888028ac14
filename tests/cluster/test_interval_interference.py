"""The interval engine prices co-location by the pair table (``--interference-pairs``), as
the event engine does: two jobs on one core slow each other by what their pair says, the
slowdown lasts while both hold GPUs, and ``--no-interference`` (or no table) turns it
off. Times hand-computed on 60-s boundaries (jobs submitted at 0 start at the first, 60:
the engine admits arrivals at boundaries)."""

from __future__ import annotations

import pytest

from phalanx.cluster.core.jobs import JobSpec
from phalanx.cluster.core.topology import uniform
from phalanx.cluster.model.interference import CoLocation, Pair, PairTable
from phalanx.cluster.model.perf import PerfModel, PerfOptions
from phalanx.cluster.policies import FIFO, Pack
from phalanx.cluster.sim.interval import IntervalConfig, IntervalSimulator

A, B = "a-single-1", "b-single-1"
# on one core a keeps half its rate beside b, b a quarter of its own beside a
TABLE = PairTable({A: {}, B: {}}, [Pair("core", A, B, 0.5, 0.25)], "test")


def run(perf: PerfModel, options: PerfOptions, co: CoLocation | None) -> list[float]:
    """Job a (600 s of work alone) and job b (150 s), both at 0, one GPU each, on a
    server of 2 GPUs behind one PCIe switch (one core): pack puts them side by side."""
    pm = PerfModel(perf.profiles, perf.pollux, options, co=co)
    jobs = [JobSpec(0, "a", 0.0, 1, 600.0, 600.0, "ResNet-18", cpu_per_gpu=1, kind=A),
            JobSpec(1, "b", 0.0, 1, 150.0, 150.0, "ResNet-18", cpu_per_gpu=1, kind=B)]
    sim = IntervalSimulator(uniform(1, 1, 1, 2, switches=1, cpu_cores=16), jobs, FIFO(),
                            Pack(), pm, config=IntervalConfig(
                                interval_s=60.0, restart_cost_s=0.0, restart_first=False,
                                check_invariants=True))
    return [j.end for j in sim.run().jobs]


def test_two_jobs_on_one_core_end_when_their_pair_says(perf) -> None:
    """From 60, beside each other b runs at 0.25: its 150 s of work take 600 s, to 660 (a
    boundary); a runs at 0.5 meanwhile (300 s done), then alone: its other 300 s end at
    960. Alone (no table, or --no-interference): 660 and 210."""
    priced = run(perf, PerfOptions(cpu=False), CoLocation(TABLE))
    assert priced == pytest.approx([960.0, 660.0])
    assert run(perf, PerfOptions(cpu=False), None) == pytest.approx([660.0, 210.0])
    assert run(perf, PerfOptions(cpu=False, interference=False),
               CoLocation(TABLE)) == pytest.approx([660.0, 210.0])


def test_a_neighbour_that_ends_inside_an_interval_weighs_until_the_boundary(perf) -> None:
    """a keeps 0.25, b 0.5: b's 150 s take 300, to 360 (a boundary); a does 75 s by then
    and its other 525 s alone end at 885. Made b's side 0.4: b ends at 60 + 375 = 435,
    inside (420, 480]; its GPU, and its weight on a, stay until 480: a has done 0.25 x
    420 = 105 s by then, and ends at 480 + 495 = 975."""
    half = PairTable({A: {}, B: {}}, [Pair("core", A, B, 0.25, 0.5)], "test")
    assert run(perf, PerfOptions(cpu=False), CoLocation(half)) == pytest.approx([885.0, 360.0])
    inside = PairTable({A: {}, B: {}}, [Pair("core", A, B, 0.25, 0.4)], "test")
    assert run(perf, PerfOptions(cpu=False), CoLocation(inside)) == pytest.approx(
        [975.0, 435.0])
