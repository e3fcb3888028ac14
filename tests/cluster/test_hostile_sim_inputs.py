"""Simulator inputs an attacker would write: a huge gang in a trace row, a cluster file
that asks for millions of devices or is binary, an unterminated CSV quote (issue 18,
cause 10). Each is one line, fast, and never eats memory."""

import json
import time

import pytest

from phalanx.cli import main
from phalanx.cluster.core.cluster_file import load_topology
from phalanx.cluster.sim.traces import TraceOptions, read_philly, read_pollux
from phalanx.errors import ConfigError, DataError

POLLUX = "name,time,application,num_replicas,batch_size\n"


def test_huge_num_replicas_is_a_bad_row_even_when_skipping(tmp_path, data_dir):
    path = tmp_path / "w.csv"
    path.write_text(POLLUX + "a,0,cifar10,400000000,128\nb,5,cifar10,2,128\n")
    t0 = time.perf_counter()
    with pytest.raises(DataError, match="line 2: num_replicas 400000000 is more than"):
        read_pollux(path, TraceOptions(data_dir))
    trace = read_pollux(path, TraceOptions(data_dir, skip_bad_rows=True))
    assert [j.name for j in trace.jobs] == ["b"] and trace.skipped == 1
    assert time.perf_counter() - t0 < 5


def test_unterminated_quote_does_not_swallow_rows(tmp_path, data_dir):
    path = tmp_path / "w.csv"
    path.write_text(POLLUX + 'a,0,cifar10,2,"128\nb,5,cifar10,2,128\nc,9,cifar10,2,128\n')
    for skip in (False, True):
        with pytest.raises(DataError, match="line 2: a quoted field runs over several lines"):
            read_pollux(path, TraceOptions(data_dir, skip_bad_rows=skip))


def test_philly_huge_gang_is_refused(tmp_path, data_dir):
    path = tmp_path / "p.csv"
    path.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n"
                    "2017-10-07 01:11:39,10.0,99999999999,10.0,c1\n")
    with pytest.raises(DataError, match="num_gpus 99999999999 is more than"):
        read_philly(path, TraceOptions(data_dir))


CLUSTER = """name: c
device_types: [{{name: v100}}]
zones:
  - racks:
      - repeat: {rack_repeat}
        servers:
          - {{name: s, device_type: v100, devices: {devices}, cpu_cores: 8, repeat: {repeat}}}
"""


@pytest.mark.parametrize("rack_repeat,devices,repeat,match", [
    (10**12, 4, 1, "repeat: 1000000000000 is more than"),
    (1, 10**9, 1, "devices: 1000000000 is more than"),
    (1, 4, 10**12, "repeat: 1000000000000 is more than"),
    (1000, 8, 1000, "more than 131072 devices"),
])
def test_huge_cluster_counts_are_refused_fast(tmp_path, rack_repeat, devices, repeat, match):
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER.format(rack_repeat=rack_repeat, devices=devices, repeat=repeat))
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=match):
        load_topology(path)
    assert time.perf_counter() - t0 < 5


def test_small_cluster_file_still_loads(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER.format(rack_repeat=2, devices=4, repeat=3))
    assert load_topology(path).num_devices == 24


def test_binary_cluster_file_is_one_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_topology(path)


@pytest.mark.parametrize("spec,match", [
    ("synthetic:jobs=100000000", "jobs must be at most"),
    ("synthetic:rate=inf", "rate must be at most"),
    ("synthetic:median=nan", "median must be > 0"), ("synthetic:max_gpus=99999999", "max_gpus"),
])
def test_synthetic_trace_spec_is_bounded(spec, match):
    from phalanx.cluster.sim.traces import SyntheticSpec

    with pytest.raises(ConfigError, match=match):
        SyntheticSpec.parse(spec)


def test_a_slot_under_a_second_is_refused():
    from phalanx.cluster.sim.run import SimulateOptions

    with pytest.raises(ConfigError, match="--slot must be .* at least 1"):
        SimulateOptions(slot_s=1e-300)


def test_skipped_rows_are_recorded_in_the_summary(tmp_path, data_dir):
    """A malformed row left out under --skip-bad-rows is counted in summary.json, not only
    printed (issue 25's appendix)."""
    trace = tmp_path / "w.csv"
    trace.write_text(POLLUX + "a,0,cifar10,2,128\nb,x,cifar10,2,128\nc,9,nope,2,128\n"
                     "d,20,cifar10,1,128\n")
    out = tmp_path / "out"
    assert main(["simulate", "--trace", str(trace), "--cluster", "pollux-64", "--data-dir",
                 str(data_dir), "--skip-bad-rows", "--no-progress", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped_rows"] == 2 and summary["jobs"] == 2
