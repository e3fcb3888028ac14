"""Time to the first training step, from the command's launch (issue 24).

For single, sync N=4, ASP N=4 (1 server) and a 2-stage pipeline: the seconds from starting
``phalanx train`` to the ``unix`` time of the run's first ``train`` event (docs/events.md),
three ways, alternated: ranks forked from a fork server that is a fork of the command itself
(``command``: now), from a fork server started as a fresh interpreter that imports torch
again (``forkserver``: issue 24 to 2026-11-27), and spawned as fresh interpreters
(``spawn``: before issue 24); and the same machine's ``python -c "import torch"`` measured
in the same run, the floor every command pays once. Ratios: each case over ``import
torch``, and each older way over ``command``. Target: sync N=4 first step <= 3 s on 2
cores, quiet (the load is reported).

And ``phalanx schedule`` (local engine) of one 2-rank sync job: from the command's launch
to the job's first step, its ranks forked from the scheduler's own fork server
(``schedule_sync2_command``: now) or started as fresh interpreters
(``schedule_sync2_fresh``: before 2026-11-27; what a scheduler that cannot fork still
does); each resume of a preempted job pays the same start again.

And ``phalanx train --resume`` of a preempted ASP N=2 run: from the command's launch to the
resumed attempt's first step, its fork server a fork of the command (``resume_asp2_command``:
now) or a fresh interpreter (``resume_asp2_fresh``: what every resume did before
2026-11-27).

And ``phalanx --help``, ``phalanx simulate --help``, ``schedule --help``, ``dashboard --help``
and ``scale --help``: seconds from launch to exit (wall and CPU), alternated with ``python
-c pass`` (the interpreter's own start); each over it, in seconds and as a ratio. Target
(issue 48): ``simulate --help`` <= 0.5 s over ``python -c pass`` (1.9 s before, when every
sub-command's flags were built, importing torch). ``--help-only`` runs these alone.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common

CASES = {
    "single": ["--strategy", "single"],
    "sync4": ["--strategy", "sync", "--workers", "4"],
    "asp4": ["--strategy", "asp", "--workers", "4", "--servers", "1"],
    "pipeline2": ["--strategy", "pipeline", "--stages", "2"],
}
PHASES: dict[str, list[dict]] = {}  # each run's summary "startup" phases
COMMON = ["--model", "mlp", "--data", "synthetic", "--max-steps", "2", "--no-progress",
          "--no-tensorboard", "--overwrite"]
# the command as ``python -m phalanx.cli`` runs it (phalanx.cli is the main module, which
# multiprocessing runs again in every rank), with the rank start method chosen first
LAUNCH = ("import runpy, sys; import phalanx.runtime.supervise as s; m = sys.argv[1]; "
          "import phalanx.runtime.command_fork as c; "
          "s.START_METHOD = 'spawn' if m == 'spawn' else 'forkserver'; "
          "c.FORK_FROM_COMMAND = m == 'command'; sys.argv = ['phalanx', *sys.argv[2:]]; "
          "runpy.run_module('phalanx.cli', run_name='__main__', alter_sys=True)")
METHODS = ("command", "forkserver", "spawn")


def first_step_s(method: str, case: str, out: Path) -> float:
    args = CASES[case]
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", LAUNCH, method, "train", *args, *COMMON,
                        "--out", str(out)], capture_output=True, text=True, cwd=_common.ROOT,
                       timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"startup bench: {method} {' '.join(args)} failed: {r.stderr[-500:]}")
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    phases = json.loads((out / "summary.json").read_text()).get("startup")
    if phases is not None:  # (a build from before issue 24 has none)
        PHASES.setdefault(f"{case}_{method}", []).append(phases)
    return min(e["unix"] for e in events if e["kind"] == "train") - t0


SCHEDULE_JOBS = ("jobs:\n  - {name: A, arrival: 0, gpus: 2, config: {model: mlp, data: "
                 "synthetic, max_steps: 2, strategy: sync, tensorboard: false}}\n")


def schedule_first_step_s(method: str, tmp: Path) -> float:
    """``phalanx schedule`` of one 2-rank sync job: seconds to the job's first step."""
    jobs, out = tmp / f"jobs-{method}.yaml", tmp / f"schedule-{method}"
    jobs.write_text(SCHEDULE_JOBS)
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", LAUNCH, method, "schedule", "--jobs", str(jobs),
                        "--cluster", "uniform:1,1,1,2", "--out", str(out)],
                       capture_output=True, text=True, cwd=_common.ROOT, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"startup bench: schedule ({method}) failed: {r.stderr[-500:]}")
    events = [json.loads(line) for line in
              (out / "jobs" / "A" / "events.jsonl").read_text().splitlines()]
    return min(e["unix"] for e in events if e["kind"] == "train") - t0


RESUMED = ["--strategy", "asp", "--workers", "2", "--model", "mlp", "--data", "synthetic",
           "--max-steps", "1000000", "--checkpoint-every", "5", "--no-progress",
           "--no-tensorboard"]


def _preempted_run(out: Path) -> None:
    """An ASP N=2 run stopped by SIGTERM after its shard's first checkpoint."""
    p = subprocess.Popen([sys.executable, "-m", "phalanx.cli", "train", *RESUMED, "--out",
                          str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, cwd=_common.ROOT)
    deadline = time.monotonic() + 120
    while not (out / "ps_shard0.ckpt").exists():
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            raise SystemExit("startup bench: the run to resume failed: "
                             f"{p.communicate()[1][-500:]}")
        time.sleep(0.05)
    p.terminate()
    if p.wait(timeout=120) == 0:
        raise SystemExit("startup bench: the run to resume finished instead of stopping")


def resume_first_step_s(method: str, tmp: Path) -> float:
    """``phalanx train --resume`` of a preempted ASP N=2 run: seconds from the command's
    launch to the resumed attempt's first step (then stopped again)."""
    out = tmp / f"resume-{method}"
    _preempted_run(out)
    events = out / "events.jsonl"
    t0 = time.time()
    p = subprocess.Popen([sys.executable, "-c", LAUNCH, method, "train", "--resume", str(out),
                          "--no-progress"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, cwd=_common.ROOT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None:
            run = [json.loads(line) for line in events.read_text().splitlines() if line]
            starts = [i for i, e in enumerate(run) if e.get("kind") == "start"]
            steps = [e["unix"] for e in run[starts[-1]:] if e.get("kind") == "train"] \
                if len(starts) > 1 else []
            if steps:
                return min(steps) - t0
            time.sleep(0.02)
        raise SystemExit(f"startup bench: resume ({method}) took no step: "
                         f"{(p.communicate()[1] if p.poll() is not None else '')[-500:]}")
    finally:
        p.terminate()
        p.wait(timeout=120)


HELP = {"help": [], "simulate_help": ["simulate"], "schedule_help": ["schedule"],
        "dashboard_help": ["dashboard"], "scale_help": ["scale"]}
HELP_REPEATS = 5  # each ~0.1-2.5 s of CPU: a median on a loaded machine (--quick: 3)


def command_s(argv: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one command from launch to exit, its output thrown away."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=_common.ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def help_startups(repeats: int) -> tuple[dict, dict, dict, dict]:
    """Each ``--help`` alternated with ``python -c pass``: medians (wall, CPU), each over
    ``python -c pass`` in seconds and as a ratio, the target and whether it is met."""
    wall: dict[str, list[float]] = {"python_pass": []}
    cpu: dict[str, list[float]] = {"python_pass": []}
    for _ in range(repeats):
        for name, args in HELP.items():  # alternated: the same load for each
            for key, argv in (("python_pass", [sys.executable, "-c", "pass"]),
                              (name, [sys.executable, "-m", "phalanx.cli", *args, "--help"])):
                w, c = command_s(argv)
                wall.setdefault(key, []).append(w)
                cpu.setdefault(key, []).append(c)
    med = {k: round(_common.median(v), 3) for k, v in wall.items()}
    med_cpu = {k: round(_common.median(v), 3) for k, v in cpu.items()}
    for name in HELP:
        print(f"{name:16s} {med[name]:5.2f} s wall, {med_cpu[name]:5.2f} s CPU (python -c "
              f"pass: {med['python_pass']:.2f} s, {med_cpu['python_pass']:.2f} s)", flush=True)
    over = {f"{k}_over_python_pass_s": round(med[k] - med["python_pass"], 3) for k in HELP}
    over.update({f"{k}_cpu_over_python_pass_s": round(med_cpu[k] - med_cpu["python_pass"], 3)
                 for k in HELP})
    results = {"help_wall_s": med, "help_cpu_s": med_cpu, **over}
    ratios = {f"{k}_over_python_pass": round(med[k] / med["python_pass"], 2) for k in HELP}
    targets = {"simulate_help_over_python_pass_s": "<= 0.5"}
    met = {"simulate_help_over_python_pass_s": over["simulate_help_over_python_pass_s"] <= 0.5}
    return results, ratios, targets, met


def import_torch_s() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true",
                    help="1 repeat of sync4, asp4, schedule and resume (under a minute), and the "
                         "--help start-ups")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--help-only", action="store_true",
                    help="only the --help start-ups (seconds)")
    a = ap.parse_args()
    load = os.getloadavg()[0]
    help_results, help_ratios, help_targets, help_met = help_startups(
        3 if a.quick else HELP_REPEATS)
    if a.help_only:
        print(json.dumps({"bench": "startup", "results": {
            "load_1min_before": round(load, 2), **help_results,
            "load_1min_after": round(os.getloadavg()[0], 2)}, "ratios": help_ratios,
            "targets": help_targets, "met": help_met}))
        return
    reps = 1 if a.quick else a.repeats
    cases = {k: CASES[k] for k in ("sync4", "asp4")} if a.quick else CASES
    results: dict = {"load_1min_before": round(load, 2)}
    times: dict[str, list[float]] = {"import_torch": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):
            # a folder per repeat: a second schedule into the same folder appended to its
            # job's events, and the first repeat's step made the time negative
            here = Path(tmp) / f"rep{rep}"
            here.mkdir()
            times["import_torch"].append(import_torch_s())
            for case in cases:
                for method in METHODS:  # alternated: the same load for each
                    t = first_step_s(method, case, Path(tmp) / f"{case}-{method}")
                    times.setdefault(f"{case}_{method}", []).append(t)
                    print(f"{case:10s} {method:10s} first step after {t:5.2f} s", flush=True)
            for method, name in (("command", "command"), ("forkserver", "fresh")):
                # under ``schedule`` the forkserver method means no fork of the command:
                # the ranks are fresh interpreters (Popen), as before
                t = schedule_first_step_s(method, here)
                times.setdefault(f"schedule_sync2_{name}", []).append(t)
                print(f"schedule   {name:10s} first step after {t:5.2f} s", flush=True)
            for method, name in (("command", "command"), ("forkserver", "fresh")):
                t = resume_first_step_s(method, here)
                times.setdefault(f"resume_asp2_{name}", []).append(t)
                print(f"resume     {name:10s} first step after {t:5.2f} s", flush=True)
    med = {k: round(_common.median(v), 3) for k, v in times.items()}
    # the summary's start-up phases (medians; the driver's own start-up, before its
    # "start" event, is the rest of the time to the first step)
    phases = {case: {k: round(_common.median([p[k] for p in runs if p.get(k) is not None]), 3)
                     for k in runs[0] if any(p.get(k) is not None for p in runs)}
              for case, runs in PHASES.items()}
    results.update(first_step_s=med, load_1min_after=round(os.getloadavg()[0], 2),
                   repeats=reps, startup_phases_s=phases)
    torch_s = med["import_torch"]
    ratios = {f"{case}_over_import_torch": round(med[f"{case}_command"] / torch_s, 2)
              for case in cases}
    ratios.update({f"{case}_{m}_over_command": round(med[f"{case}_{m}"] / med[f"{case}_command"],
                                                     2)
                   for case in cases for m in METHODS[1:]})
    ratios["schedule_sync2_fresh_over_command"] = round(
        med["schedule_sync2_fresh"] / med["schedule_sync2_command"], 2)
    ratios["resume_asp2_fresh_over_command"] = round(
        med["resume_asp2_fresh"] / med["resume_asp2_command"], 2)
    results.update(help_results)
    ratios.update(help_ratios)
    targets = {"sync4_command_first_step_s": "<= 3.0", **help_targets}
    met = {"sync4_command_first_step_s": med["sync4_command"] <= 3.0, **help_met}
    print(json.dumps({"bench": "startup", "results": results, "ratios": ratios,
                      "targets": targets, "met": met}))


if __name__ == "__main__":
    main()
