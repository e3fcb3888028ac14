"""One chaos run (:func:`run_one`) and a series of seeds (:func:`run`): a job mix
scheduled live on this machine's slots with ``phalanx schedule --engine local``, or on a
Ray cluster of test hosts with ``--engine ray`` (:mod:`site`), faults injected at the
seeded times, the invariants checked once the schedule ended.

Each run writes ``OUT/seed-S/``: ``jobs.yaml``, ``schedule/`` (the schedule's folder),
``scheduler.log`` (every scheduler's output, the resumed ones' too), ``faults.jsonl``
(every planned fault: when, the scheduler's clock then, the target, the outcome) and
``result.json`` (the violations by invariant). References (uninterrupted runs of the
kinds whose parameters are compared) are made once in ``OUT/references`` (on this
machine's slots, for either engine)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from phalanx.cluster.chaos import procs
from phalanx.cluster.chaos.disk import Tmpfs
from phalanx.cluster.chaos.faults import Fault, plan
from phalanx.cluster.chaos.inject import Scene, inject
from phalanx.cluster.chaos.invariants import check
from phalanx.cluster.chaos.jobs import CLUSTER, ChaosJob, JobKind, job_mix, write_job_list
from phalanx.cluster.chaos.options import ChaosOptions
from phalanx.cluster.chaos.site import Site, site_for
from phalanx.cluster.chaos.view import RunView
from phalanx.cluster.chaos.watch import Watch
from phalanx.cluster.core.clusters import default_data_dir, resolve_cluster
from phalanx.cluster.live.joblist import load_job_list

ROOT = Path(__file__).resolve().parents[3]   # the phalanx the schedule runs
LEFT_WAIT_S = 10.0      # processes of the run may take this long to go once it ended
FAULT_GAP_S = 0.5       # at least this long between two faults
RETRY_S = 0.25          # a fault with no target yet is tried again this often


@dataclass
class RunResult:
    seed: int
    faults: list[Fault]
    violations: dict[str, list[str]]
    wall_s: float

    @property
    def violated(self) -> int:
        return sum(len(v) for v in self.violations.values())


class Scheduler:
    """``phalanx schedule`` as a child of the harness: started, killed with SIGKILL,
    resumed; its output appended to one log."""

    def __init__(self, jobs: Path, out: Path, env: dict[str, str], log: Path,
                 site: Site) -> None:
        self.jobs, self.out, self.env, self.log, self.site = jobs, out, env, log, site
        self.proc: subprocess.Popen | None = None
        self.since = self.since_unix = 0.0
        self.killed = False   # by the harness: resume it
        self.starts = 0

    def start(self) -> None:
        where = ["--resume", str(self.out)] if self.starts else ["--out", str(self.out)]
        cmd = self.site.argv([
            sys.executable, "-m", "phalanx.cli", "schedule", "--jobs", str(self.jobs),
            "--cluster", self.site.cluster, *self.site.flags(), *where, "--max-job-restarts",
            "20", "--grace", "10"])
        with open(self.log, "a") as f:
            f.write(f"# chaos: {' '.join(cmd[cmd.index('-m') + 1:])}\n")
            f.flush()
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self.env, cwd=ROOT,
                                         start_new_session=True)
        self.since, self.since_unix, self.killed = time.monotonic(), time.time(), False
        self.starts += 1

    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.killed = True

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


def references(opts: ChaosOptions, env: dict[str, str],
               catalog: tuple[JobKind, ...]) -> dict[str, Path]:
    """Each reference kind's uninterrupted run (one schedule of one job per kind of
    ``catalog``, made once per ``--out`` and engine): kind -> the job's run folder."""
    folder = opts.out / ("references" if opts.engine == "local" else f"references-{opts.engine}")
    kinds = [k for k in catalog if k.reference]
    made = {k.name: folder / "schedule" / "jobs" / f"ref-{k.name}" for k in kinds}
    if all((p / "checkpoint.pt").is_file() for p in made.values()):
        return made
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    write_job_list([ChaosJob(f"ref-{k.name}", k, 0.0) for k in kinds], folder / "jobs.yaml")
    r = subprocess.run([sys.executable, "-m", "phalanx.cli", "schedule", "--jobs",
                        str(folder / "jobs.yaml"), "--cluster", CLUSTER, "--out",
                        str(folder / "schedule")], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=600, check=False)
    missing = [n for n, p in made.items() if not (p / "checkpoint.pt").is_file()]
    if r.returncode != 0 or missing:
        raise RuntimeError(f"the reference runs failed ({missing}): {r.stdout[-2000:]}")
    return made


def _victims(jobs: list[ChaosJob], planned_disk: int, seed: int) -> list[ChaosJob]:
    """Jobs whose run folder is a tmpfs: one per planned disk-full fault (at most the
    jobs that may run there)."""
    able = [j for j in jobs if j.kind.disk]
    return sorted(random.Random(seed).sample(able, min(planned_disk, len(able))),
                  key=lambda j: j.name)


def _env(tmp: Path) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": path}


def _shm() -> frozenset[str]:
    return frozenset(p.name for p in Path("/dev/shm").glob("phalanx-*"))


def run_one(opts: ChaosOptions, seed: int, refs: dict[str, Path],
            say: Callable[[str], None] = print, site: Site | None = None) -> RunResult:
    """One seeded run (see the module's docstring) on ``site`` (default: local slots)."""
    if site is None:
        with site_for("local", ROOT) as local:
            return run_one(opts, seed, refs, say, local)
    wall = time.monotonic()
    folder = opts.out / f"seed-{seed}"
    shutil.rmtree(folder, ignore_errors=True)
    out, tmp = folder / "schedule", folder / "tmp"
    tmp.mkdir(parents=True)
    jobs = job_mix(opts.jobs, seed, site.catalog)
    write_job_list(jobs, folder / "jobs.yaml")
    live_jobs = load_job_list(folder / "jobs.yaml")
    topology = resolve_cluster(site.cluster, default_data_dir())
    planned = plan(seed, opts.faults, opts.kinds, opts.window(len(jobs)))
    victims = _victims(jobs, sum(p.kind == "disk-full" for p in planned), seed)
    faults = [Fault(p.kind, p.at, hold=p.hold) for p in planned]
    env, shm_before = site.env(tmp), _shm()
    sched = Scheduler(folder / "jobs.yaml", out, env, folder / "scheduler.log", site)
    watch = Watch(out, jobs, live_jobs, topology, str(folder / "jobs.yaml"), site.hosts())
    scene = Scene(out, jobs, victims, sched.pid, lambda: sched.since,
                  lambda: sched.since_unix, sched.kill, watch.seen, keeper=site.keeper)
    harness_bad: list[str] = site.ready()
    problems_before = len(site.keeper.problems) if site.keeper else 0
    with Tmpfs([out / "jobs" / j.name for j in victims]) as disks:
        sched.start()
        watch.start()
        t0 = time.monotonic()
        todo = list(zip(planned, faults))
        last = tried = -FAULT_GAP_S
        try:
            while True:
                now = time.monotonic() - t0
                for item in [u for u in scene.undo if u[0] <= time.monotonic()]:
                    scene.undo.remove(item)
                    item[1]()
                rc = sched.proc.poll()
                if rc is not None:
                    if not sched.killed:
                        if rc != 0:
                            harness_bad.append(f"the scheduler exited {rc}")
                        break
                    time.sleep(0.3)      # an operator notices, and starts it again
                    sched.start()
                    continue
                if now > opts.timeout_s:
                    harness_bad.append(f"the schedule did not end in {opts.timeout_s:g} s")
                    break
                # one fault at a time, apart: two at one instant on one target are one
                due = [x for x in todo if x[0].at <= now]
                if due and now - last >= FAULT_GAP_S and now - tried >= RETRY_S:
                    tried = now     # a look at /proc costs: not at every pass
                    for p, f in due:
                        if inject(p, f, scene, now):
                            todo.remove((p, f))
                            last = now
                            say(f"  {f.at:7.2f} s  {f.kind:16s} {f.job} {f.target}")
                            break
                time.sleep(0.05)
        finally:
            for _, undo in scene.undo:
                undo()
            sched.kill()
            seen = watch.stop()
            for _, f in todo:
                f.outcome = "missed: no target before the schedule ended"
            _wait_gone(seen.pids | set(procs.mentioning(procs.scan(), str(out))))
            harness_bad += disks.release()
            harness_bad += site.ready()   # the last host fault's node back
            if site.keeper:
                harness_bad += site.keeper.problems[problems_before:]
    view = RunView(out, jobs, faults, seen, refs, sched.output(), tmp, shm_before,
                   site.actors_left())
    violations = check(view)
    violations["the harness"] = harness_bad
    _sweep(seen.pids, out)
    with open(folder / "faults.jsonl", "w") as f:
        for fault in faults:
            f.write(json.dumps(fault.row()) + "\n")
    result = RunResult(seed, faults, violations, time.monotonic() - wall)
    (folder / "result.json").write_text(json.dumps(
        {"seed": seed, "violations": violations, "wall_s": round(result.wall_s, 1),
         "jobs": len(jobs), "faults": [f.row() for f in faults]}, indent=1) + "\n")
    return result


def _wait_gone(pids: set[int]) -> None:
    deadline = time.monotonic() + LEFT_WAIT_S
    while time.monotonic() < deadline:
        table = procs.scan()
        if not any(procs.live(table, p) for p in pids):
            return
        time.sleep(0.1)


def _sweep(pids: set[int], out: Path) -> None:
    """Kill what the run left (after the check counted it): nothing outlives the harness."""
    table = procs.scan()
    for pid in [p for p in pids if procs.live(table, p)] + procs.mentioning(table, str(out)):
        with_signal = procs.live(table, pid)
        if with_signal:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def run(opts: ChaosOptions, say: Callable[[str], None] = print) -> list[RunResult]:
    """``opts.runs`` seeded runs, one after another, on one site (on Ray: one cluster of
    test hosts for every seed, torn down at the end)."""
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "references-tmp").mkdir(parents=True, exist_ok=True)
    with site_for(opts.engine, ROOT) as site:
        refs = references(opts, _env(opts.out / "references-tmp"), site.catalog)
        return _series(opts, refs, site, say)


def _series(opts: ChaosOptions, refs: dict[str, Path], site: Site,
            say: Callable[[str], None]) -> list[RunResult]:
    results = []
    for seed in range(opts.seed, opts.seed + opts.runs):
        say(f"chaos seed {seed}: {opts.jobs} jobs, {opts.faults} faults "
            f"({', '.join(opts.kinds)})")
        r = run_one(opts, seed, refs, say, site)
        say(f"chaos seed {seed}: {sum(f.outcome == 'injected' for f in r.faults)} faults "
            f"injected, {r.violated} violation(s), {r.wall_s:.0f} s")
        for name, bad in r.violations.items():
            for line in bad:
                say(f"  violated: {name}: {line}")
        results.append(r)
    return results
