"""Bad input for the scheduler (issue 8): gangs the cluster can never hold are rejected with
their reason (per job, counted, never a hang); malformed flags, traces and clusters give one
line and exit 2. Runs ``phalanx.cli.main`` in this process (the user's code path minus the
interpreter start-up)."""

import csv
import json
from pathlib import Path

import pytest

from phalanx.cli import main
from phalanx.cluster.core.cluster_file import topology_from_mapping
from phalanx.cluster.core.jobs import JobSpec
from phalanx.cluster.core.topology import uniform
from phalanx.cluster.policies import ORDERINGS, make_ordering, make_placement
from phalanx.cluster.sim.event import SimConfig, Simulator

FIXTURES = Path(__file__).parent / "fixtures"
PHILLY = str(FIXTURES / "philly_small.csv")


@pytest.mark.parametrize("ordering", sorted(ORDERINGS))
def test_oversize_gangs_are_rejected_and_the_rest_finish(ordering, perf):
    topo = uniform(servers=2, devices=4, switches=2, cpu_cores=16)     # 8 GPUs
    jobs = [JobSpec(0, "ok", 0.0, 4, 600.0, 600.0, "bert"),
            JobSpec(1, "huge", 10.0, 256, 600.0, 600.0, "bert"),
            JobSpec(2, "ok2", 20.0, 8, 600.0, 600.0, "bert")]
    res = Simulator(topo, jobs, make_ordering(ordering, 300.0), make_placement("pack"), perf,
                    config=SimConfig(check_invariants=True)).run()
    assert [(s.name, r) for s, r in res.rejected] == [("huge", "needs 256 GPUs, cluster has 8")]
    assert res.oversize == 1 and [j.spec.name for j in res.jobs] == ["ok", "ok2"]
    assert all(j.end > 0 for j in res.jobs)


def test_gang_larger_than_the_cores_allow(perf):
    # 2 servers x 4 GPUs but only 2 cores each: every GPU needs a core, so 4 GPUs at most
    topo = topology_from_mapping({"name": "thin", "device_types": [{"name": "v100"}],
                                  "zones": [{"name": "z", "racks": [{"name": "r", "servers": [
                                      {"name": "s", "repeat": 2, "device_type": "v100",
                                       "devices": 4, "cpu_cores": 2}]}]}]})
    jobs = [JobSpec(0, "six", 0.0, 6, 60.0, 60.0, "bert", cpu_per_gpu=1),
            JobSpec(1, "four", 0.0, 4, 60.0, 60.0, "bert", cpu_per_gpu=1)]
    res = Simulator(topo, jobs, make_ordering("las", 30.0), make_placement("topology"),
                    perf).run()
    assert res.rejected[0][1] == "needs 6 GPUs, cluster has 8 but only 4 with a free CPU core each"
    assert len(res.jobs) == 1 and res.jobs[0].end > 0


def run_cli(capsys, *args):
    """(exit code, stdout, stderr) of ``phalanx simulate ARGS`` (argparse errors exit via
    SystemExit, everything else returns)."""
    try:
        rc = main(["simulate", "--no-progress", *args])
    except SystemExit as e:
        rc = e.code
    cap = capsys.readouterr()
    return rc, cap.out, cap.err

def test_cli_records_rejections(tmp_path, capsys):
    out = tmp_path / "o"
    rc, stdout, err = run_cli(capsys, "--trace", PHILLY, "--cluster", "uniform:1,1,1,4",
                              "--out", str(out))
    assert rc == 0, err
    rows = list(csv.DictReader((out / "jobs.csv").open()))
    big = [r for r in rows if int(r["gpus"]) > 4]
    assert big and all(r["status"] == f"rejected: needs {r['gpus']} GPUs, cluster has 4"
                       for r in big)
    s = json.loads((out / "summary.json").read_text())
    assert s["rejected"] == s["rejected_oversize"] == len(big)
    assert s["finished"] == s["jobs"] - len(big) and s["unfinished"] == 0
    assert f"{len(big)} job(s) need more GPUs" in stdout


def test_cli_whole_trace_unusable(tmp_path, capsys):
    t = tmp_path / "big.csv"
    t.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n"
                 "2017-10-09 07:01:55,60,16,960,vc\n2017-10-09 07:02:55,60,32,1920,vc\n")
    rc, _, err = run_cli(capsys, "--trace", str(t), "--cluster", "uniform:1,1,1,8")
    assert rc == 2 and err.count("\n") == 1
    assert "none of its 2 jobs fits cluster uniform-1x1x1x8 (smallest gang 16 GPUs" in err


@pytest.mark.parametrize("args, text", [
    (("--load-scale", "inf"), "--load-scale must be a number in (0, 1000]"),
    (("--slot", "inf", "--policy", "las"), "--slot must be a finite number > 0"),
    (("--checkpoint-cost", "nan"), "--checkpoint-cost must be a finite number >= 0"),
    (("--interference-scale", "-1"), "--interference-scale must be a finite number >= 0"),
    (("--threshold", "1.5"), "--threshold must be in [0, 1]"),
    (("--hysteresis", "0.9"), "--hysteresis must be in [0, threshold=0.5]"),
    (("--limit", "-3"), "--limit must be >= 0"),
    (("--quota", "vc1"), "--quota vc1: expected VC=GPUS"),
    (("--compare", "fifo,sjf:nowhere"), "placement 'nowhere': unknown"),
    (("--study", "nope"), "invalid choice: 'nope'"),
    (("--seed", "x"), "invalid int value: 'x'"),
])
def test_bad_flags(args, text, capsys):
    rc, _, err = run_cli(capsys, "--trace", PHILLY, "--cluster", "uniform:1,1,2,8", *args)
    assert rc == 2 and text in err and err.count("\n") == 1, err

def test_bad_files(tmp_path, capsys):
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\x00\x01\xff\xfe garbage\n")
    empty = tmp_path / "empty.csv"
    empty.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n")
    not_dir = tmp_path / "file"
    not_dir.write_text("x")
    yaml_bad = tmp_path / "c.yaml"
    yaml_bad.write_text("zones: [\n")
    yaml_short = tmp_path / "d.yaml"
    yaml_short.write_text("name: x\ndevice_types: [{name: v100}]\nzones: [{name: z, racks: "
                          "[{name: r, servers: [{name: s, device_type: v100, devices: 4}]}]}]\n")
    for args, text in (
            (("--trace", str(binary)), "not a text CSV file"),
            (("--trace", str(empty)), "no jobs"),
            (("--trace", str(tmp_path)), "cannot read"),
            (("--trace", str(tmp_path / "missing.csv")), "cannot read"),
            (("--trace", PHILLY, "--out", str(not_dir)), "exists and is not a directory"),
            (("--trace", PHILLY, "--cluster", str(yaml_bad)), "invalid YAML at line"),
            (("--trace", PHILLY, "--cluster", str(yaml_short)), "missing 'cpu_cores'"),
            (("--trace", PHILLY, "--cluster", str(tmp_path / "no.yaml")), "cannot read"),
            (("--trace", PHILLY, "--cluster", "uniform:0,1,2,8"), "zones must be a positive"),
            (("--trace", PHILLY, "--data-dir", str(tmp_path)), "cannot read"),
            (("--trace", "pollux:9"), "workloads are 1..8"),
            (("--trace", "synthetic:jobs=0"), "jobs must be > 0")):
        rc, _, err = run_cli(capsys, "--cluster", "uniform:1,1,2,8", *args) \
            if "--cluster" not in args else run_cli(capsys, *args)
        assert rc == 2 and text in err and err.count("\n") == 1, (args, err)
        assert "Traceback" not in err


@pytest.mark.parametrize("which", ["jobs", "cluster"])
def test_a_file_nested_100000_deep_is_one_line(tmp_path, capsys, which):
    deep = tmp_path / "deep.yaml"
    deep.write_text(f"{'jobs' if which == 'jobs' else 'servers'}: " + "[" * 100_000
                    + "]" * 100_000 + "\n")
    ok_jobs = tmp_path / "jobs.yaml"
    ok_jobs.write_text("jobs:\n  - {name: a, arrival: 0, gpus: 1, config: {model: mlp, data: "
                       "synthetic}}\n")
    args = (["--jobs", str(deep), "--cluster", "uniform:1,1,1,2"] if which == "jobs"
            else ["--jobs", str(ok_jobs), "--cluster", str(deep)])
    assert main(["schedule", *args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    what = f"job list {deep}" if which == "jobs" else f"cluster file {deep}"
    assert err == [f"phalanx: error: {what}: nested too deeply to read"]


@pytest.mark.parametrize("gpus,config,line", [
    (1, "strategy: single, dc_lambda: 0.5",
     "--dc-lambda: --strategy single does not use it (only dc-asgd); drop it"),
    (2, "strategy: single",
     "--workers: --strategy single trains with 1 worker(s), got 2 (choose a parallel "
     "strategy, e.g. sync)"),
    (1, "data: fashion-mnist, data_dir: /nonexistent",
     "--data-dir /nonexistent: no such directory (apt-get install dataset-fashion-mnist)"),
    (1, "device: cuda", "--device cuda: no CUDA device is available on this machine"),
])
def test_a_job_list_is_checked_as_phalanx_train_checks_a_run(tmp_path, capsys, gpus, config,
                                                              line):
    """The whole list is refused before any job starts, naming the job and the setting."""
    if "cuda" in config:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - {name: fine, arrival: 0, gpus: 1, config: {model: mlp, data: "
                    f"synthetic}}}}\n  - {{name: bad, arrival: 0, gpus: {gpus}, config: "
                    f"{{model: mlp, data: synthetic, {config}}}}}\n")
    out = tmp_path / "out"
    assert main(["schedule", "--jobs", str(jobs), "--cluster", "uniform:1,1,1,2", "--out",
                 str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"phalanx: error: job list {jobs}: bad: {line}"]
    assert not (out / "jobs").exists()  # nothing started


@pytest.mark.parametrize("args,line", [
    (["schedule", "--jobs", "never-read.yaml", "--interval", "5", "--policy", "fifo"],
     "--interval: --policy fifo does not use it (only goodput, pollux, sia, gavel: their "
     "round); drop it"),
    (["schedule", "--jobs", "never-read.yaml", "--slot", "10"],
     "--slot: --policy fifo does not use it (only las, tiresias, rr); drop it"),
    (["schedule", "--jobs", "never-read.yaml", "--policy", "las", "--starvation", "2"],
     "--starvation: --policy las does not use it (only tiresias); drop it"),
    (["schedule", "--jobs", "never-read.yaml", "--hysteresis", "0.1"],
     "--hysteresis: --placement pack does not use it (only load-adaptive, "
     "load-adaptive-demand); drop it"),
    (["simulate", "--policy", "tiresias", "--profiles", "oracle"],
     "--profiles: --policy tiresias does not use it (only goodput, pollux, sia, gavel); drop it"),
    (["simulate", "--policy", "fifo", "--goodput-batch", "fixed"],
     "--goodput-batch: --policy fifo does not use it (only goodput); drop it"),
    (["simulate", "--compare", "fifo,sjf", "--pollux-search", "greedy"],
     "--pollux-search: --policy fifo, sjf does not use it (only pollux); drop it"),
    (["schedule", "--jobs", "never-read.yaml", "--goodput-start", "2"],
     "--goodput-start: --policy fifo does not use it (only goodput); drop it"),
    (["schedule", "--jobs", "never-read.yaml", "--policy", "goodput", "--goodput-start", "0"],
     "typed.start (--goodput-start) must be a whole number of GPUs in 1..64, got 0"),
    (["simulate", "--policy", "goodput", "--goodput-start", "65"],
     "typed.start (--goodput-start) must be a whole number of GPUs in 1..64, got 65"),
])
def test_a_flag_the_chosen_policy_does_not_read_is_refused(tmp_path, capsys, args, line):
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"phalanx: error: {line}"]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_policy_that_cannot_run_is_refused_before_the_run_is_announced(tmp_path, capsys):
    """Issue 51's appendix: sia on a cluster of one GPU type printed "simulating 20 jobs
    ..." and then its refusal; every policy is now made before the announcement."""
    code = main(["simulate", "--no-progress", "--policy", "sia", "--cluster",
                 "uniform:1,1,2,4", "--trace", "synthetic:jobs=20", "--out",
                 str(tmp_path / "o")])
    out = capsys.readouterr()
    assert code == 2 and "simulating" not in out.out, out.out
    assert out.err.count("\n") == 1 and out.err.startswith("phalanx: error: "), out.err
