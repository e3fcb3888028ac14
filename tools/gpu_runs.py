"""Every strategy for a few steps on CUDA, on one model: step ``runs-MODEL`` of
tools/gpu_check.sh (docs/gpu.md).

    python3 tools/gpu_runs.py --model lenet5 --data .gpu-data --out OUT/logs --budget 60 \
        [--jobs K] [--dry]

The strategies come from the registry (``phalanx.parallel.registry.NAMES``), each with the
conformance suite's small settings (its spec's ``example``, ``--workers 2`` unless the spec
fixes them, nothing the spec lists as unused). Each run is ``python3 -m phalanx.cli train
... --device cuda`` with its own log (``OUT/runs/MODEL-STRATEGY.log``) and time bound; the
table of runs is ``OUT/runs-MODEL.json``. A strategy whose spec has no CUDA path is
skipped with the spec's reason. ``--dry``: nothing trains; each run's flags are parsed and
checked as ``phalanx train`` checks them, against the data and the model, with the CPU
standing in for the GPU.

A run phalanx refuses with its one-line error (exit 2: a strategy that cannot split this
model, say) is ``refused``: listed with its reason, not a failure. Exit status: 0 no run
failed or timed out, 1 one did (or the data does not load, or the runner was stopped by
SIGTERM), 3 the model is not in this checkout (skipped: the last line says why), 2 bad
arguments.

``--jobs K``: up to K runs at once, started in the registry's order as slots free up; the
table stays in that order, and each run keeps its own log, exit code, bound (never past
the budget) and process-group kill. The runs are a functional check: their samples/s, with
K runs sharing the GPU and the cores, are not a measurement of speed (the benchmarks are;
the table records K). In a dry run the checks run in this process, one at a time.
SIGTERM (the step's bound): every running group is stopped (SIGTERM, SIGKILL 5 s later),
no further run starts, and the table is written.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# the conformance suite's small run (tests/conformance/test_strategy_conformance.py), a few
# more steps: 1024 samples keep 8 steps of 2 workers x 32 inside one epoch
SMALL = {"max_steps": 8, "batch_size": 32, "train_limit": 1024, "test_limit": 256, "seed": 3,
         # one intra-op thread per process: several runs share the machine, and each left
         # to its defaults takes every core (the driver PyTorch's all, each rank cores /
         # ranks). The GPU check of 2026-11-27 ran the GPT's runs six at once that way and
         # each passed its 60 s bound (7 s alone); 3 GPT runs at once on a 2-core machine
         # took 21 s in all by default, 9.5 s with one thread each
         "threads": 1, "worker_threads": 1}
PER_RUN_S = 60  # one run's bound (start-up included); the step's budget bounds them all
MIN_RUN_S = 10  # a run is not started with less left than this
STOP = threading.Event()  # SIGTERM: stop the running groups, start no more
CHECKING = threading.Lock()  # a dry run's check redirects this process's stderr
TEXT_FILE = "text/tinyshakespeare.txt"  # inside the data folder (tools/gpu_prepare.sh)


@dataclass(frozen=True, kw_only=True)
class Case:
    """A model with the data it trains on here: ``data_dir`` "" = the data set needs none."""

    model: str
    data: str
    data_dir: str = ""


@dataclass(frozen=True, kw_only=True)
class PlannedRun:
    strategy: str
    argv: tuple[str, ...]  # after ``python3 -m phalanx.cli train``, without --out
    skip: str = ""  # why it is not run ("" = it is)


@dataclass(kw_only=True)
class Table:
    """What ``OUT/runs-MODEL.json`` holds."""

    model: str
    dry: bool
    strategies: list[str]
    jobs: int = 1  # runs at once: their samples/s are a functional check's, not a benchmark
    data: str = ""
    data_dir: str = ""
    skipped: str = ""  # the whole model was skipped: why
    error: str = ""  # its data did not load: the one-line reason
    runs: list[dict] = field(default_factory=list)


def load_error(data: str, data_dir: str) -> str:
    """"" when ``--data data --data-dir data_dir`` loads (a few samples), else why not."""
    from phalanx.data import load_data
    from phalanx.entry.flags import one_line
    from phalanx.errors import PhalanxError

    try:
        load_data(data, data_dir or None, 0, 64, 64)
    except PhalanxError as e:  # its message names the input
        return one_line(str(e))
    except Exception as e:  # a loader's bug is reported too, not raised
        return one_line(f"--data {data}" + (f" --data-dir {data_dir}" if data_dir else "")
                        + f": {type(e).__name__}: {e}")
    return ""


def text_candidates(root: Path) -> list[tuple[str, str]]:
    """(--data, --data-dir) pairs the GPT model may read its text with, in order; the first
    that loads is used. The GPU machine has no ``../shared``, so the copied file comes
    first: ``--data shakespeare --data-dir FILE``, then ``--data text --data-dir FILE``,
    then ``--data shakespeare`` alone (the copy the package may ship)."""
    from phalanx.data import DATASETS

    file = str(root / TEXT_FILE)
    pairs = [("shakespeare", file), ("text", file), ("shakespeare", "")]
    return [(data, data_dir) for data, data_dir in pairs if data in DATASETS]


def case_for(model: str, root: Path) -> tuple[Case | None, str, str]:
    """(the case, why it is skipped, why its data does not load) for ``model`` on the data
    folder ``root``."""
    from phalanx.data import DATASETS
    from phalanx.models import MODELS

    if model not in MODELS:
        return None, (f"model {model} is not in this checkout's catalog "
                      f"(phalanx.models.MODELS: {', '.join(MODELS)})"), ""
    if model == "gpt":
        pairs = text_candidates(root)
        if not pairs:
            return None, ("no text data set in the catalog (phalanx.data.DATASETS: "
                          f"{', '.join(DATASETS)}; wanted shakespeare or text)"), ""
        errors = []
        for data, data_dir in pairs:
            error = load_error(data, data_dir)
            if not error:
                return Case(model=model, data=data, data_dir=data_dir), "", ""
            errors.append(error)
        return Case(model=model, data=pairs[0][0], data_dir=pairs[0][1]), "", "; ".join(errors)
    if model == "ctr":
        if "ctr-synthetic" not in DATASETS:
            return None, ("data set ctr-synthetic is not in this checkout's catalog "
                          f"(phalanx.data.DATASETS: {', '.join(DATASETS)})"), ""
        case = Case(model=model, data="ctr-synthetic")
    else:  # the image models: Fashion-MNIST from the data folder
        case = Case(model=model, data="fashion-mnist", data_dir=str(root / "fashion-mnist"))
    return case, "", load_error(case.data, case.data_dir)


def flags(settings: dict[str, object]) -> list[str]:
    out: list[str] = []
    for name, value in settings.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        else:
            out += [flag, str(value)]
    return out


def plan(case: Case) -> list[PlannedRun]:
    """One small CUDA run per strategy of the registry, in its order."""
    from phalanx.parallel.registry import NAMES, spec

    runs = []
    for name in NAMES:
        s = spec(name)
        settings: dict[str, object] = {"model": case.model, "data": case.data}
        if case.data_dir:
            settings["data_dir"] = case.data_dir
        # the spec's small settings, but the case's model and data (a strategy whose example
        # names its own model, as tensor's GPT, is refused on another case's model)
        example = {k: v for k, v in s.example.items() if k not in ("model", "data", "data_dir")}
        settings.update({"strategy": name, **SMALL, "workers": s.fixed_workers or 2, **example})
        for unused in s.unused:  # a setting the strategy refuses to be given
            settings.pop(unused, None)
        argv = (*flags(settings), "--device", "cuda", "--no-progress", "--no-tensorboard")
        skip = "" if s.device.cuda else f"no CUDA path: {s.device.reason}"
        runs.append(PlannedRun(strategy=name, argv=argv, skip=skip))
    return runs


def check(run: PlannedRun, out: Path) -> tuple[str, str]:
    """(status, reason) of the run as ``phalanx train`` would take it, no process started:
    the flags, the settings against the strategy's spec, the placement with the CPU
    standing in for the GPU, the data and the model. "ok"; "refused": a one-line error of
    phalanx's (the strategy declines this model or setting); "failed": the flags do not
    parse (this plan is wrong) or something raised (a bug)."""
    from phalanx.cli import build_parser
    from phalanx.config import parse_device
    from phalanx.entry.api import make_job
    from phalanx.entry.flags import config_from_args, one_line
    from phalanx.entry.preflight import check_job_data
    from phalanx.errors import PhalanxError
    from phalanx.parallel.registry import check_flags_apply, spec
    from phalanx.runtime.placement import check_run

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = build_parser().parse_args(["train", *run.argv, "--out", str(out)])
    except SystemExit:
        return "failed", one_line(err.getvalue().strip())
    try:
        parse_device(args.device)  # cuda, cuda:K; then the CPU stands in for the GPU
        args.device = "cpu"
        cfg = config_from_args(args)
        check_flags_apply(cfg)
        s = spec(cfg.strategy)
        check_run(cfg, s.world_size(cfg), s.device)  # the placement's other checks
        job = make_job(cfg)
        check_job_data(job)
        s.check_job(job)
    except PhalanxError as e:
        return "refused", one_line(str(e))
    except Exception as e:  # a bug is one row of the table too
        return "failed", one_line(f"{type(e).__name__}: {e}")
    return "ok", ""


def last_line(path: Path) -> str:
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:500] if lines else ""


def stop_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM to the run's process group (the driver stops its ranks), SIGKILL ``grace``
    seconds later if it is still there."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def execute(run: PlannedRun, log: Path, timeout: float) -> dict:
    """Run it as its own process group, bounded by ``timeout``: past it, SIGTERM (the
    driver stops its ranks), then SIGKILL to the group 10 s later. :data:`STOP` set (the
    runner got SIGTERM) stops it at once, with 5 s of grace."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-run-") as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "phalanx.cli", "train", *run.argv, "--out", str(out)]
        t0 = time.monotonic()
        with log.open("w") as f:
            f.write(f"$ {shlex.join(cmd)}\n")
            f.flush()
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            stopped = False
            while True:
                try:
                    rc = proc.wait(timeout=min(0.2, max(0.01, t0 + timeout - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    stopped = STOP.is_set()
                    if stopped or time.monotonic() >= t0 + timeout:
                        stop_group(proc, 5 if stopped else 10)
                        rc = 124
                        break
        row = {"rc": rc, "seconds": round(time.monotonic() - t0, 1)}
        summary = out / "summary.json"
        if rc == 0 and summary.is_file():
            s = json.loads(summary.read_text())
            row.update({k: s.get(k) for k in ("steps", "test_accuracy", "samples_per_s",
                                              "startup_s", "wall_s")})
    row["status"] = "ok" if rc == 0 else "timeout" if rc == 124 else "failed"
    if rc == 124 and stopped:
        row["reason"] = "stopped with the runner (SIGTERM: the step's bound)"
    elif rc == 124:
        row["reason"] = f"past its {round(timeout, 1):g} s bound"
    elif rc != 0:
        row["reason"] = last_line(log)
        if rc == 2 and row["reason"].startswith("phalanx: error: "):
            row["status"] = "refused"  # phalanx's one line: the run was not accepted
    return row


def in_order(items: Sequence, jobs: int, work: Callable[[int], dict]) -> list[dict]:
    """``work(i)`` for each index of ``items``, up to ``jobs`` at once, started in the
    items' order as slots free up; the results in the items' order."""
    if jobs <= 1:
        return [work(i) for i in range(len(items))]
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="run") as pool:
        futures = [pool.submit(work, i) for i in range(len(items))]  # FIFO: registry order
        return [f.result() for f in futures]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, help="the data folder (tools/gpu_prepare.sh)")
    ap.add_argument("--out", required=True, help="folder of runs-MODEL.json and runs/")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds for all the runs")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
    ap.add_argument("--dry", action="store_true", help="check each run, start none")
    args = ap.parse_args(argv)
    if args.budget <= 0:
        ap.error(f"--budget: {args.budget} must be > 0")
    if args.jobs < 1:
        ap.error(f"--jobs: {args.jobs} must be >= 1")
    deadline = time.monotonic() + args.budget
    from phalanx.parallel.registry import NAMES

    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    table = Table(model=args.model, dry=args.dry, strategies=list(NAMES), jobs=args.jobs)
    case, skipped, error = case_for(args.model, Path(args.data))
    table.skipped, table.error = skipped, error
    printing = threading.Lock()
    STOP.clear()
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda *_: STOP.set()) if main_thread else None
    try:
        if case is not None:
            table.data, table.data_dir = case.data, case.data_dir
            planned = plan(case)

            def one(i: int) -> dict:
                run = planned[i]
                row = {"strategy": run.strategy, "command": shlex.join(
                    ["python3", "-m", "phalanx.cli", "train", *run.argv])}
                log = out / "runs" / f"{args.model}-{run.strategy}.log"
                left = deadline - time.monotonic()  # when a slot frees for it
                if run.skip:
                    row.update(status="skipped", reason=run.skip)
                elif error:  # nothing to train on: every run fails for the one reason
                    row.update(status="failed", reason=error)
                elif STOP.is_set():
                    row.update(status="skipped", reason="the runner was stopped (SIGTERM)")
                elif left < MIN_RUN_S:
                    row.update(status="skipped", reason="the step's time bound is spent")
                elif args.dry:
                    with CHECKING:
                        status, reason = check(run, Path(tempfile.gettempdir())
                                               / "gpu-check-run")
                    row.update(status=status, reason=reason)
                else:
                    row.update(execute(run, log, min(PER_RUN_S, left)),
                               log=f"runs/{log.name}")
                with printing:
                    print(f"{args.model} {run.strategy}: {row['status']}"
                          + (f" ({row['reason']})" if row.get("reason") else ""), flush=True)
                return row

            table.runs = in_order(planned, args.jobs, one)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    text = json.dumps(dataclasses.asdict(table), indent=1)
    (out / f"runs-{args.model}.json").write_text(text + "\n")
    if skipped:
        print(skipped)  # the last line: the step's reason
        return 3
    if error:
        print(f"its data does not load: {error}")
        return 1
    bad = [r["strategy"] for r in table.runs if r["status"] in ("failed", "timeout")]
    if bad:
        print(f"{len(bad)} of {len(table.runs)} runs failed or timed out: {', '.join(bad)}")
    refused = [r["strategy"] for r in table.runs if r["status"] == "refused"]
    if refused and not bad:  # a strategy may decline a model: shown, not a failure
        print(f"refused by phalanx (one-line errors, in the table): {', '.join(refused)}")
    if STOP.is_set():
        print("stopped by SIGTERM (the step's bound): the runs not started are skipped")
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
