"""A table of hostile inputs through the real CLI (issue 18's probe, kept as a test).

Every case must end within a time bound with exit 2, exactly one stderr line, starting
``phalanx: error:``, nothing on stdout, no traceback, no process left behind, and no file
changed outside its ``--out``. Each case is its own process, forked from one parent that
imported the CLI once (``forkrunner.py``), so the table costs about its slowest case
rather than ~2 s of ``import torch`` per case.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from phalanx.data.idx import write_idx

REPO = Path(__file__).resolve().parents[2]
SHARED = (REPO / ".." / "shared" / "data").resolve()
TIME_LIMIT_S = 120.0  # per case, on a loaded 2-core machine (most end in 1-3 s)
TRAIN = ["train", "--data", "synthetic", "--model", "mlp", "--max-steps", "5", "--no-progress",
         "--no-tensorboard"]


@dataclass(frozen=True)
class Case:
    name: str
    args: Callable[[Path], list[str]]  # the case folder -> argv after "phalanx"
    expect: str  # a piece of the error line
    setup: Callable[[Path], None] = lambda d: None


def idx_dir(d: Path, n_train: int = 40, n_test: int = 10, labels=np.uint8) -> Path:
    data = d / "data"
    data.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(data / f"{prefix}-images-idx3-ubyte.gz",
                  rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8))
        write_idx(data / f"{prefix}-labels-idx1-ubyte.gz",
                  rng.integers(0, 10, size=n).astype(labels))
    return data


def _raw_header(*dims: int, code: int = 0x08) -> bytes:
    return bytes([0, 0, code, len(dims)]) + struct.pack(">" + "I" * len(dims), *dims)


def corrupt_deflate(d: Path) -> None:
    data = idx_dir(d)
    p = data / "train-images-idx3-ubyte.gz"
    blob = bytearray(p.read_bytes())
    blob[len(blob) // 2:len(blob) // 2 + 32] = b"\xff" * 32
    p.write_bytes(bytes(blob))


def wrapping_header(d: Path) -> None:
    data = idx_dir(d)
    (data / "train-images-idx3-ubyte.gz").unlink()
    (data / "train-images-idx3-ubyte").write_bytes(_raw_header(2**32 - 1, 2**32 - 1, 2**32 - 1)
                                                   + b"\0" * 64)


def gzip_bomb(d: Path) -> None:
    data = idx_dir(d)
    (data / "train-images-idx3-ubyte.gz").write_bytes(
        gzip.compress(_raw_header(60000, 2048, 2048) + b"\0" * 4_000_000))


def nan_labels(d: Path) -> None:
    data = idx_dir(d, labels=np.float32)
    labels = np.zeros(40, dtype=np.float32)
    labels[7] = np.nan
    write_idx(data / "train-labels-idx1-ubyte.gz", labels)


def laughs(d: Path) -> None:
    items = ['&a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        items.append(f"&{'abcdefghi'[i]} [" + ",".join([f"*{'abcdefghi'[i - 1]}"] * 9) + "]")
    (d / "bomb.yaml").write_text("model: [" + ", ".join(items) + "]\n")


def previous_run(d: Path) -> None:
    (d / "out").mkdir()
    (d / "out" / "summary.json").write_text('{"strategy": "asp"}')
    (d / "out" / "ps_shard0.ckpt").write_bytes(b"x")


def foreign_files(d: Path) -> None:
    (d / "out").mkdir()
    (d / "out" / "notes.txt").write_text("mine")


def a_file(d: Path) -> None:
    (d / "file").write_text("precious")


def pollux_trace(d: Path) -> None:
    (d / "w.csv").write_text("name,time,application,num_replicas,batch_size\n"
                             "a,0,cifar10,400000000,128\n")


def unterminated(d: Path) -> None:
    (d / "w.csv").write_text("name,time,application,num_replicas,batch_size\n"
                             'a,0,cifar10,2,"128\nb,5,cifar10,2,128\n')


def cluster_yaml(d: Path, text: bytes) -> None:
    (d / "c.yaml").write_bytes(text)


def job_list(d: Path) -> None:
    (d / "victim").mkdir()
    (d / "victim" / "config.json").write_text("{}")
    (d / "jobs.yaml").write_text("jobs:\n  - name: a\n    arrival: 0\n    gpus: 1\n"
                                 f"    config: {{model: mlp, resume: {d / 'victim'}}}\n")


def deep_json(d: Path) -> None:
    (d / "run").mkdir()
    (d / "run" / "config.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)


def gzip_bomb_within_ratio(d: Path) -> None:
    """A header declaring 3.5M images (2.7 GB of pixels, ~11 GB as float32: under half of a
    24 GiB machine, so the old per-copy bound let it through) over a few MB of gzip that
    really inflate to that much: concatenated gzip members of 64 MiB of zeros each."""
    data = idx_dir(d)
    n = 3_500_000
    zeros = gzip.compress(b"\0" * (64 << 20), compresslevel=1)
    members = -(-n * 784 // (64 << 20))
    (data / "train-images-idx3-ubyte.gz").write_bytes(
        gzip.compress(_raw_header(n, 28, 28)) + zeros * members)


def raw_checkpoint(d: Path, code: bool) -> None:
    """A finished sync run's folder whose checkpoint holds a checksummed bare pickle (with
    code in it, or not) where a torch payload belongs."""
    import hashlib
    import pickle

    run = d / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({
        "strategy": "sync", "workers": 2, "model": "mlp", "data": "synthetic",
        "max_steps": 4, "checkpoint_every": 2, "progress": False, "tensorboard": False,
        "out": str(run)}))
    body = pickle.dumps({"x": _Evil()} if code else {"step": 2})
    (run / "checkpoint.pt").write_bytes(b"PHXCKPT1" + hashlib.sha256(body).digest() + body)


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def finished_run(d: Path) -> None:
    raw_checkpoint(d, code=False)
    (d / "run" / "summary.json").write_text('{"strategy": "sync", "test_accuracy": 0.9}')


def philly_row(d: Path, row: str) -> None:
    (d / "p.csv").write_text(f"timestamp,duration,num_gpus,gpu_time,cluster\n{row}\n")


def pollux_rows(d: Path, *rows: str) -> None:
    (d / "w.csv").write_text("name,time,application,num_replicas,batch_size\n"
                             + "".join(r + "\n" for r in rows))


def jobs_yaml(d: Path, entry: str) -> None:
    (d / "jobs.yaml").write_text(f"jobs:\n  - {entry}\n")


NAN_SPEED = (b"name: c\ndevice_types: [{name: v100, speed: .nan}]\nzones:\n  - racks:\n"
             b"      - servers: [{name: s, device_type: v100, devices: 2, cpu_cores: 8}]\n")
DUP_RACKS = (b"name: c\ndevice_types: [{name: v100}]\nzones:\n  - racks:\n"
             b"      - {name: r, servers: [{name: s, device_type: v100, devices: 2, "
             b"cpu_cores: 8}]}\n"
             b"      - {name: r, servers: [{name: t, device_type: v100, devices: 2, "
             b"cpu_cores: 8}]}\n")
JOB = "{name: a, arrival: 0, gpus: 1, config: {model: mlp, data: synthetic, max_steps: 2}}"
SIM = ["simulate", "--data-dir", str(SHARED), "--no-progress"]


HUGE_CLUSTER = (b"name: c\ndevice_types: [{name: v100}]\nzones:\n  - racks:\n"
                b"      - repeat: 1000000000000\n        servers:\n"
                b"          - {name: s, device_type: v100, devices: 4, cpu_cores: 8}\n")

OUT = ["--out"]
CASES = [
    # flags
    Case("epochs 1e308", lambda d: [*TRAIN, "--epochs", "1e308", *OUT, str(d / "out")],
         "--epochs"),
    Case("bucket-mb inf", lambda d: [*TRAIN, "--strategy", "sync", "--workers", "2",
                                     "--bucket-mb", "inf", *OUT, str(d / "out")], "--bucket-mb"),
    Case("seed past int64", lambda d: [*TRAIN, "--seed", "99999999999999999999", *OUT,
                                       str(d / "out")], "--seed"),
    Case("lr nan", lambda d: [*TRAIN, "--lr", "nan", *OUT, str(d / "out")], "--lr"),
    Case("slow factor inf", lambda d: [*TRAIN, "--workers", "2", "--strategy", "asp",
                                       "--slow-workers", "0:inf", *OUT, str(d / "out")],
         "--slow-workers"),
    Case("workers 100000", lambda d: [*TRAIN, "--workers", "100000", *OUT, str(d / "out")],
         "--workers"),
    # zero-step epochs
    Case("batch > data", lambda d: [*TRAIN, "--batch-size", "5000", *OUT, str(d / "out")],
         "--batch-size: 5000 is larger than"),
    Case("asp batch > shard", lambda d: [*TRAIN, "--strategy", "asp", "--workers", "2",
                                         "--batch-size", "5000", *OUT, str(d / "out")],
         "--batch-size: 5000 is larger than"),
    Case("train-limit 10", lambda d: [*TRAIN, "--train-limit", "10", *OUT, str(d / "out")],
         "larger than the training set"),
    # config files
    Case("binary config", lambda d: [*TRAIN, "--config", str(d / "c.yaml"), *OUT,
                                     str(d / "out")], "not UTF-8",
         lambda d: cluster_yaml(d, b"\xff\xfe\x00\x01")),
    Case("non-string keys", lambda d: [*TRAIN, "--config", str(d / "c.yaml"), *OUT,
                                       str(d / "out")], "setting names must be strings",
         lambda d: cluster_yaml(d, b"1: 2\nnull: 1\n")),
    Case("yaml bomb", lambda d: [*TRAIN, "--config", str(d / "bomb.yaml"), *OUT,
                                 str(d / "out")], "model", laughs),
    # output folders
    Case("out is a file", lambda d: [*TRAIN, *OUT, str(d / "file")], "not a directory", a_file),
    Case("out under a file", lambda d: [*TRAIN, *OUT, str(d / "file" / "x")], "is a file",
         a_file),
    Case("out in /proc", lambda d: [*TRAIN, *OUT, "/proc/self/x"], "system folder"),
    Case("out holds a run", lambda d: [*TRAIN, *OUT, str(d / "out")], "not empty",
         previous_run),
    Case("overwrite foreign", lambda d: [*TRAIN, "--overwrite", *OUT, str(d / "out")],
         "notes.txt", foreign_files),
    Case("resume + other out", lambda d: [*TRAIN, "--resume", str(d / "file"), *OUT,
                                          str(d / "out")], "own folder", a_file),
    Case("compare out file", lambda d: ["compare", "--strategies", "single", *TRAIN[1:], *OUT,
                                        str(d / "file")], "not a directory", a_file),
    Case("experiments out under file", lambda d: ["experiments", "run", "averaging-period",
                                                  "--quick", *OUT, str(d / "file" / "x")],
         "is a file", a_file),
    # data files
    Case("corrupt deflate", lambda d: [*TRAIN, "--data", "idx", "--data-dir", str(d / "data"),
                                       *OUT, str(d / "out")], "corrupt gzip", corrupt_deflate),
    Case("header wraps int64", lambda d: [*TRAIN, "--data", "idx", "--data-dir",
                                          str(d / "data"), *OUT, str(d / "out")], "truncated",
         wrapping_header),
    Case("gzip bomb", lambda d: [*TRAIN, "--data", "idx", "--data-dir", str(d / "data"), *OUT,
                                 str(d / "out")], "gzip file can hold", gzip_bomb),
    Case("nan labels", lambda d: [*TRAIN, "--data", "idx", "--data-dir", str(d / "data"), *OUT,
                                  str(d / "out")], "whole numbers", nan_labels),
    Case("empty test split", lambda d: [*TRAIN, "--data", "idx", "--data-dir",
                                        str(d / "data"), *OUT, str(d / "out")],
         "test split is empty", lambda d: idx_dir(d, n_test=0) and None),
    # other commands and settings found by probing further
    Case("models shape", lambda d: ["models", "--input-shape", "abc"], "--input-shape"),
    Case("models classes", lambda d: ["models", "--classes", "-1"], "--classes"),
    Case("demo epochs nan", lambda d: ["demo", "--epochs", "nan", *OUT, str(d / "out")],
         "--epochs"),
    Case("heartbeat 1e-9", lambda d: [*TRAIN, "--strategy", "asp", "--workers", "2",
                                      "--heartbeat-s", "1e-9", *OUT, str(d / "out")],
         "--heartbeat-s"),
    Case("grad-accum > epoch", lambda d: [*TRAIN, "--grad-accum", "1000", *OUT,
                                          str(d / "out")], "--grad-accum"),
    Case("resume deep json", lambda d: [*TRAIN[:1], "--resume", str(d / "run")],
         "not valid JSON", deep_json),
    # simulator and scheduler inputs
    Case("huge num_replicas", lambda d: ["simulate", "--trace", str(d / "w.csv"),
                                         "--skip-bad-rows", "--data-dir", str(SHARED),
                                         "--no-progress", *OUT, str(d / "out")], "no jobs",
         pollux_trace),
    Case("unterminated quote", lambda d: ["simulate", "--trace", str(d / "w.csv"),
                                          "--data-dir", str(SHARED), "--no-progress", *OUT,
                                          str(d / "out")], "unterminated quote", unterminated),
    Case("huge cluster", lambda d: ["simulate", "--trace", "synthetic:jobs=3", "--cluster",
                                    str(d / "c.yaml"), "--data-dir", str(SHARED),
                                    "--no-progress", *OUT, str(d / "out")], "more than",
         lambda d: cluster_yaml(d, HUGE_CLUSTER)),
    Case("binary cluster", lambda d: ["simulate", "--trace", "synthetic:jobs=3", "--cluster",
                                      str(d / "c.yaml"), "--data-dir", str(SHARED),
                                      "--no-progress", *OUT, str(d / "out")], "not UTF-8",
         lambda d: cluster_yaml(d, b"\x89PNG\r\n\x1a\n\xff\xfe")),
    Case("job resumes another run", lambda d: ["schedule", "--jobs", str(d / "jobs.yaml"), *OUT,
                                               str(d / "out")], "resume", job_list),
    # issue 25's appendix: flags a run would have ignored
    *[Case(f"ignored {' '.join(extra)}", lambda d, extra=extra: [*TRAIN, *extra, *OUT,
                                                                 str(d / "out")], expect)
      for extra, expect in [
          (["--sfb", "--strategy", "asp", "--workers", "2"], "--sfb: --strategy asp"),
          (["--stages", "4"], "--stages: --strategy single"),
          (["--pull-ahead", "--strategy", "sync", "--workers", "2"], "--pull-ahead"),
          (["--outer-lr", "0.5"], "--outer-lr"),
          (["--outer-lr", "0.5", "--strategy", "average", "--workers", "2"],
           "--outer-lr: only read with --outer-rule"),
          (["--servers", "4", "--strategy", "sync", "--workers", "2"], "--servers"),
          (["--heartbeat-s", "0.5"], "--heartbeat-s"),
          (["--on-worker-loss", "stop", "--strategy", "sync", "--workers", "2"],
           "--on-worker-loss"),
          (["--slow-workers", "0:400"], "--slow-workers"),
          (["--data-dir", "X"], "--data-dir: only read with --data"),
          (["--momentum", "0.5", "--rule", "adam"], "--momentum: only read with --rule"),
          (["--gamma", "0.5"], "--gamma: only read with --schedule step"),
          (["--config", ""], "--config: the path is empty")]],
    # ... hangs
    Case("uniform 1000^4", lambda d: [*SIM, "--cluster", "uniform:1000,1000,1000,1000", *OUT,
                                      str(d / "out")], "devices"),
    Case("uniform 1000^3", lambda d: [*SIM, "--cluster", "uniform:1000,1000,1000", *OUT,
                                      str(d / "out")], "--cluster"),
    Case("interval 1e-9", lambda d: [*SIM, "--interval", "1e-9", *OUT, str(d / "out")],
         "--interval"),
    Case("arrival 1e9", lambda d: ["schedule", "--jobs", str(d / "jobs.yaml"), *OUT,
                                   str(d / "out")], "arrival",
         lambda d: jobs_yaml(d, JOB.replace("arrival: 0", "arrival: 1e9"))),
    Case("schedule uniform 1000^4", lambda d: ["schedule", "--jobs", str(d / "jobs.yaml"),
                                               "--cluster", "uniform:1000,1000,1000,1000",
                                               *OUT, str(d / "out")], "devices",
         lambda d: jobs_yaml(d, JOB)),
    Case("compare 1e8 seeds", lambda d: ["compare", "--strategies", "single", *TRAIN[1:],
                                         "--seeds", "100000000", *OUT, str(d / "out")],
         "--seeds"),
    # ... tracebacks
    Case("pollux batch 1e12", lambda d: [*SIM, "--trace", str(d / "w.csv"), *OUT,
                                         str(d / "out")], "batch_size",
         lambda d: pollux_rows(d, "a,0,cifar10,2,1000000000000")),
    Case("out name 300 bytes", lambda d: [*TRAIN, *OUT, str(d / ("x" * 300))],
         "longer than the 255"),
    # ... memory
    Case("gzip bomb within ratio", lambda d: [*TRAIN, "--data", "idx", "--data-dir",
                                              str(d / "data"), *OUT, str(d / "out")],
         "this machine has free", gzip_bomb_within_ratio),
    # ... lines before the error line
    Case("bare pickle checkpoint", lambda d: ["train", "--resume", str(d / "run")],
         "unreadable checkpoint", lambda d: raw_checkpoint(d, code=False)),
    Case("pickle with code", lambda d: ["train", "--resume", str(d / "run")],
         "unreadable checkpoint", lambda d: raw_checkpoint(d, code=True)),
    Case("experiments data nope", lambda d: ["experiments", "run", "averaging-period",
                                             "--quick", "--data", "nope", *OUT,
                                             str(d / "out")], "--data: 'nope'"),
    # ... accepted nonsense
    Case("cluster speed nan", lambda d: [*SIM, "--trace", "synthetic:jobs=3", "--cluster",
                                         str(d / "c.yaml"), *OUT, str(d / "out")],
         "speed", lambda d: cluster_yaml(d, NAN_SPEED)),
    Case("cluster speed inf", lambda d: [*SIM, "--trace", "synthetic:jobs=3", "--cluster",
                                         str(d / "c.yaml"), *OUT, str(d / "out")],
         "speed", lambda d: cluster_yaml(d, NAN_SPEED.replace(b".nan", b".inf"))),
    Case("duplicate racks", lambda d: [*SIM, "--trace", "synthetic:jobs=3", "--cluster",
                                       str(d / "c.yaml"), *OUT, str(d / "out")],
         "duplicate rack name", lambda d: cluster_yaml(d, DUP_RACKS)),
    Case("duplicate job names", lambda d: [*SIM, "--trace", str(d / "w.csv"), *OUT,
                                           str(d / "out")], "used twice",
         lambda d: pollux_rows(d, "a,0,cifar10,2,256", "a,5,cifar10,2,256")),
    Case("duration 1e308", lambda d: [*SIM, "--trace", str(d / "p.csv"), *OUT,
                                      str(d / "out")], "duration",
         lambda d: philly_row(d, "2017-10-09 07:01:55,1e308,1,66.0,c1")),
    Case("load-scale 1e308", lambda d: [*SIM, "--load-scale", "1e308", *OUT, str(d / "out")],
         "--load-scale"),
    Case("simulate seed -1", lambda d: [*SIM, "--seed", "-1", *OUT, str(d / "out")], "--seed"),
    Case("job value wrong type", lambda d: ["schedule", "--jobs", str(d / "jobs.yaml"), *OUT,
                                            str(d / "out")], "max_steps",
         lambda d: jobs_yaml(d, JOB.replace("max_steps: 2", "max_steps: abc"))),
    Case("job larger than cluster", lambda d: ["schedule", "--jobs", str(d / "jobs.yaml"),
                                               *OUT, str(d / "out")], "more than the cluster",
         lambda d: jobs_yaml(d, JOB.replace("gpus: 1", "gpus: 64"))),
    Case("compare ,,,", lambda d: [*SIM, "--compare", ",,,", *OUT, str(d / "out")],
         "names no policy"),
    Case("resume a finished run", lambda d: ["train", "--resume", str(d / "run")],
         "already finished", finished_run),
    # ... wrong messages
    Case("year-1 timestamp", lambda d: [*SIM, "--trace", str(d / "p.csv"), *OUT,
                                        str(d / "out")], "out of range",
         lambda d: philly_row(d, "0001-01-01 00:00:00,66,1,66.0,c1")),
]


def snapshot(root: Path, skip: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, _dirnames, filenames in os.walk(root):
        if Path(dirpath) == skip or skip in Path(dirpath).parents:
            continue
        for f in filenames:
            if Path(dirpath) == root and f in (".stdout", ".stderr"):
                continue
            st = (Path(dirpath) / f).stat()
            out[str(Path(dirpath) / f)] = (st.st_size, st.st_mtime_ns)
    return out


def processes_with(marker: str) -> list[int]:
    """Live processes that inherited the case's environment marker."""
    found = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in env.read_bytes():
                found.append(int(env.parent.name))
        except OSError:
            continue
    return found


@dataclass
class Outcome:
    code: int | None
    stdout: str
    stderr: str
    seconds: float
    changed: list[str]
    left: list[int]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Outcome]:
    """Every case through the real ``phalanx`` CLI, each in its own process forked from one
    pre-loaded parent (``forkrunner.py``: the CLI is imported once, not once per case)."""
    root = tmp_path_factory.mktemp("hostile")
    jobs, befores = [], {}
    for i, case in enumerate(CASES):
        d = root / f"case{i}"
        d.mkdir()
        case.setup(d)
        befores[case.name] = (d, snapshot(d, d / "out"))
        jobs.append({"name": case.name, "argv": case.args(d), "cwd": str(d),
                     "env": {"PHALANX_PROBE": uuid.uuid4().hex}, "timeout": TIME_LIMIT_S})
    r = subprocess.run([sys.executable, str(Path(__file__).with_name("forkrunner.py"))],
                       input=json.dumps(jobs), capture_output=True, text=True,
                       timeout=TIME_LIMIT_S * 3, cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(r.stdout.splitlines()[-1])
    out = {}
    for job in jobs:
        d, before = befores[job["name"]]
        after = snapshot(d, d / "out")
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        res = results[job["name"]]
        out[job["name"]] = Outcome(res["code"], (d / ".stdout").read_text(),
                                   (d / ".stderr").read_text(), res["seconds"], changed,
                                   processes_with(f"PHALANX_PROBE={job['env']['PHALANX_PROBE']}"))
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input_is_one_line_exit_2(outcomes, case):
    o = outcomes[case.name]
    assert o.code == 2, f"exit {o.code} after {o.seconds:.1f}s: {o.stderr[-2000:]}"
    lines = o.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("phalanx: error:"), o.stderr[-2000:]
    assert case.expect in lines[0], lines[0]
    assert o.stdout == "", f"printed before the error: {o.stdout[-500:]}"
    assert "Traceback" not in o.stderr
    assert o.changed == [], f"files changed outside --out: {o.changed}"
    assert o.left == [], f"processes left: {o.left}"
