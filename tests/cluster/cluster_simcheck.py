"""The checks every simulation must pass (used by the property and conformance suites)."""

import functools
from pathlib import Path

from phalanx.cluster.core.result import SimResult
from phalanx.cluster.model.interference import CoLocation, gavel_table
from phalanx.cluster.policies import make_placement

DATA = (Path(__file__).resolve().parents[2] / ".." / "shared" / "data").resolve()


@functools.lru_cache(maxsize=1)
def gavel_pairs() -> CoLocation:
    return CoLocation(gavel_table(DATA))


def placement(name: str):
    """``make_placement(name)``, the ``interference`` placement with Gavel's pairs."""
    return make_placement(name, co=gavel_pairs())


def check_result(res: SimResult, n_jobs: int, capacity: int) -> None:
    # every job finishes (none is rejected when every gang fits the cluster)
    assert not res.rejected
    assert len(res.jobs) == n_jobs and all(j.end >= j.spec.submit for j in res.jobs)
    assert all(j.start >= j.spec.submit and j.remaining == 0.0 for j in res.jobs)
    # gang all-or-nothing: each (re)start holds exactly the gang's devices, all distinct
    for j in res.jobs:
        assert j.placements and all(len(set(d)) == len(d) == j.spec.gpus
                                    for _, d in j.placements)
        assert len(j.placements) == j.preemptions + 1
    # GPU-time conservation: what jobs were charged == the area under the busy curve
    charged = sum(j.spec.gpus * j.executed for j in res.jobs)
    area = sum(b * (t1 - t0) for t0, t1, b in zip(res.times, res.times[1:], res.busy))
    assert abs(charged - area) <= 1e-6 * max(1.0, area)
    assert max(res.busy) <= capacity and res.busy[-1] == 0
    # nobody progresses faster than on its ideal placement (rates are <= 1 for these jobs)
    for j in res.jobs:
        assert j.executed >= j.spec.work * (1 - 1e-9) - 1e-6


def rows(res: SimResult) -> list[tuple]:
    return [(j.spec.id, round(j.start, 6), round(j.end, 6), j.preemptions,
             tuple(tuple(d) for _, d in j.placements)) for j in res.jobs]
