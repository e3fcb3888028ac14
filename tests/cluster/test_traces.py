"""Trace readers on the real files, malformed rows with line numbers, the synthetic
generator's determinism."""

import shutil
from pathlib import Path

import pytest

from phalanx.cluster.sim.traces import (
    SyntheticSpec,
    TraceOptions,
    load_trace,
    read_philly,
    synthetic,
)
from phalanx.errors import ConfigError, DataError

FIXTURES = Path(__file__).parent / "fixtures"


def test_whole_philly_trace(data_dir):
    tr = load_trace("philly", TraceOptions(data_dir))
    assert len(tr.jobs) == 82247 and tr.skipped == 0
    assert tr.jobs[0].submit == 0.0
    assert all(a.submit <= b.submit for a, b in zip(tr.jobs, tr.jobs[1:]))
    assert max(j.gpus for j in tr.jobs) == 128
    assert sum(j.gpus * j.duration for j in tr.jobs) / 3600 == pytest.approx(978078.47, 1e-6)


def test_philly_fixture_and_limits(data_dir):
    tr = read_philly(FIXTURES / "philly_small.csv", TraceOptions(data_dir, limit=10,
                                                                   load_scale=2.0))
    assert len(tr.jobs) == 10 and [j.id for j in tr.jobs] == list(range(10))
    full = read_philly(FIXTURES / "philly_small.csv", TraceOptions(data_dir))
    assert tr.jobs[-1].submit == pytest.approx(full.jobs[9].submit / 2)


@pytest.mark.parametrize("bad, message", [
    ("2017-10-09 07:01:55,abc,1,66.0,11cb48", "line 5: duration 'abc' is not a number"),
    ("2017-10-09 07:01:55,66.0,0,66.0,11cb48", "line 5: num_gpus must be > 0"),
    ("yesterday,66.0,1,66.0,11cb48", "line 5: timestamp 'yesterday'"),
    ("2017-10-09 07:01:55,66.0,1,66.0", "line 5: expected 5 fields, got 4"),
])
def test_bad_philly_row(tmp_path, data_dir, bad, message):
    lines = (FIXTURES / "philly_small.csv").read_text().splitlines()
    lines.insert(4, bad)
    p = tmp_path / "t.csv"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=message):
        read_philly(p, TraceOptions(data_dir))
    tr = read_philly(p, TraceOptions(data_dir, skip_bad_rows=True))
    assert tr.skipped == 1 and len(tr.jobs) == len(lines) - 2


def test_bad_header(tmp_path, data_dir):
    p = tmp_path / "t.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(DataError, match="line 1: expected header"):
        read_philly(p, TraceOptions(data_dir))


def test_pollux_workloads(data_dir, tmp_path):
    for n in range(1, 9):
        tr = load_trace(f"pollux:{n}", TraceOptions(data_dir))
        assert len(tr.jobs) == 160
        assert all(j.work > 0 and j.duration > 0 and j.batch_size > 0 for j in tr.jobs)
    with pytest.raises(ConfigError, match="workloads are 1..8"):
        load_trace("pollux:9", TraceOptions(data_dir))
    p = tmp_path / "w.csv"
    shutil.copy(data_dir / "pollux" / "workloads" / "workload-1.csv", p)
    p.write_text(p.read_text() + "x-1,10,resnet,2,64\n")
    with pytest.raises(DataError, match="line 162: application 'resnet'"):
        load_trace(str(p), TraceOptions(data_dir))


def test_synthetic_is_seeded(data_dir):
    spec = SyntheticSpec.parse("synthetic:jobs=50,rate=10,max_gpus=8")
    a = synthetic(spec, TraceOptions(data_dir, seed=1))
    assert a == synthetic(spec, TraceOptions(data_dir, seed=1))
    assert a != synthetic(spec, TraceOptions(data_dir, seed=2))
    assert len(a.jobs) == 50 and max(j.gpus for j in a.jobs) <= 8
    with pytest.raises(ConfigError, match="unknown key"):
        SyntheticSpec.parse("synthetic:size=3")
