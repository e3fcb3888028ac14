"""Performance model against the measured data it is fitted on."""

import csv

import pytest

from phalanx.cluster.allocator import ClusterState
from phalanx.cluster.jobs import JobSpec
from phalanx.cluster.perf import PerfModel, PerfOptions, Shape
from phalanx.cluster.policies import Pack, Spread
from phalanx.cluster.profiles import load_pollux_apps, load_profiles, min_rotation
from phalanx.cluster.topology import uniform


def test_min_rotation():
    assert min_rotation([4, 2]) == "24" and min_rotation([3, 1, 2]) == "123"
    assert min_rotation([2, 1, 3]) == "132"


def test_pollux_step_time_reproduces_placements_csv(data_dir):
    apps = load_pollux_apps(data_dir)
    for app in ("bert", "imagenet", "ncf"):
        with open(data_dir / "pollux" / "applications" / app / "placements.csv") as f:
            for row in list(csv.DictReader(f))[::37]:
                counts = tuple(int(ch) for ch in row["placement"])
                batch = int(row["local_bsz"]) * sum(counts)
                assert apps[app].step_time(counts, batch) == pytest.approx(
                    float(row["step_time"]), rel=1e-9)


def test_gradient_accumulation_beyond_the_per_gpu_limit(data_dir):
    yolo = load_pollux_apps(data_dir)["yolov3"]
    assert yolo.max_local_bsz == 16
    one = yolo.step_time((1,), 16)
    compute, sync = yolo.placements["1"].at(16)
    assert yolo.step_time((1,), 64) == pytest.approx(4 * compute + sync)
    assert yolo.step_time((1,), 64) > 3 * one


def test_pollux_work_from_validation_files(data_dir):
    apps = load_pollux_apps(data_dir)
    assert apps["bert"].steps(384) == 480.0          # validation-384.csv, epoch 2
    with open(data_dir / "pollux" / "applications" / "cifar10" / "validation-128.csv") as f:
        per_epoch = int(next(csv.DictReader(f))["iteration"])
    # an unvalidated batch: epochs x samples / batch, samples from the smallest batch
    assert apps["cifar10"].steps(1000) == 100 * -(-per_epoch * 128 // 1000)


def test_fitted_profiles_are_sane(data_dir):
    p = load_profiles(data_dir)
    assert len(p) == 13
    for prof in p.values():
        assert prof.spread_penalty >= 0 and 0 <= prof.interference <= 1
    # measured: bert's all-reduce is heavy, spreading it hurts far more than ImageNet's
    assert p["bert"].spread_penalty > p["imagenet"].spread_penalty > 0
    assert p["ResNet-50"].speed_on("k80", 1.0) < p["ResNet-50"].speed_on("p100", 1.0) < 1


def test_generic_rates(data_dir, perf):
    topo = uniform(racks=2, servers=2, devices=8, switches=2)
    job = JobSpec(0, "j", 0, 8, 100, 100, "bert")
    ideal = Shape((8,), 1, 1, 1, 1.0, 1.0)
    assert perf.isolated_rate(job, ideal, topo) == pytest.approx(1.0)
    split = perf.isolated_rate(job, Shape((4, 4), 0, 1, 1, 1.0, 1.0), topo)
    racks = perf.isolated_rate(job, Shape((4, 4), 0, 2, 1, 1.0, 1.0), topo)
    assert racks < split < 1.0
    slow_dev = perf.isolated_rate(job, Shape((8,), 1, 1, 1, 0.5, 1.0), topo)
    starved = perf.isolated_rate(job, Shape((8,), 1, 1, 1, 1.0, 0.25), topo)
    assert slow_dev == pytest.approx(0.5) and starved == pytest.approx(0.25 ** 0.3)
    assert perf.interference_factor(job, 0.5) < 1.0 == perf.interference_factor(job, 0.0)
    off = PerfModel(perf.profiles, perf.pollux, PerfOptions(interference=False, cpu=False))
    assert off.interference_factor(job, 0.5) == 1.0
    assert off.isolated_rate(job, Shape((8,), 1, 1, 1, 1.0, 0.25), topo) == 1.0


def test_pack_vs_spread_interference_with_neighbours(perf):
    """Spread keeps a 1-GPU job away from a busy server; pack puts it next to it."""
    from phalanx.cluster.policies import FIFO
    from phalanx.cluster.simulator import Simulator

    topo = uniform(servers=2, devices=4, switches=1, cpu_cores=16)
    jobs = [JobSpec(0, "a", 0, 2, 1000, 1000, "ResNet-50"),
            JobSpec(1, "b", 1, 1, 1000, 1000, "ResNet-50")]
    packed = Simulator(topo, jobs, FIFO(), Pack(), perf).run()
    spread = Simulator(topo, jobs, FIFO(), Spread(), perf).run()
    assert spread.jobs[1].end == pytest.approx(1001.0)
    assert packed.jobs[1].end > spread.jobs[1].end
    assert ClusterState(topo).total_free == 8
