"""Live mode: the scheduler runs real ``phalanx train`` processes on local slots.

Each device of the topology is a local *slot* (``uniform:1,1,2,2`` = 4 slots on 2
"servers"). The queue, admission and the fill pass are the simulator's
(``SchedulerCore``), with the same ordering and placement objects on the same
``ClusterState``; only the clock and execution differ: time is the wall clock since start,
a placed job becomes a subprocess

    python -m phalanx.cli train --config OUT/configs/NAME.json --out OUT/jobs/NAME
        --workers GANG --threads 1 --no-progress

with ``CUDA_VISIBLE_DEVICES`` set to its slot ids (so on a GPU host a slot is a GPU), and
its devices are freed when the process exits. Outputs are the simulator's ``summary.json``
and ``jobs.csv`` (real start/end times, seconds after start) plus each job's own run folder
and log (``OUT/logs/NAME.log``).

Preemptive (time-sliced) orderings are refused: stopping a training process and resuming
it elsewhere would need checkpoint/restore plumbing the strategies do not share yet.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from phalanx.cluster.allocator import Placement
from phalanx.cluster.joblist import LiveJob
from phalanx.cluster.jobs import JobState
from phalanx.cluster.policies import AdmissionPolicy, OrderingPolicy, PlacementPolicy
from phalanx.cluster.scheduler import SchedulerCore
from phalanx.cluster.simulator import SimResult
from phalanx.cluster.topology import Topology
from phalanx.errors import ConfigError


@dataclass(frozen=True)
class LiveConfig:
    out: Path
    poll_s: float = 0.05            # how often exits and arrivals are checked
    job_timeout_s: float = 0.0      # kill a job running longer than this (0 = never)
    python: str = sys.executable

    def __post_init__(self) -> None:
        if not 0 < self.poll_s <= 5:
            raise ConfigError(f"--poll must be in (0, 5] seconds, got {self.poll_s}")
        if not 0 <= self.job_timeout_s < float("inf"):
            raise ConfigError(f"--job-timeout must be a finite number >= 0, "
                              f"got {self.job_timeout_s}")


class _Proc:
    __slots__ = ("log", "popen", "state")

    def __init__(self, state: JobState, popen: subprocess.Popen, log: IO[bytes]) -> None:
        self.state, self.popen, self.log = state, popen, log


def _last_error_line(path: Path) -> str:
    """The line that says why a run failed: its ``phalanx: error:`` line, else the last."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()
                 if ln.strip()]
    except OSError:
        return "no log"
    for ln in reversed(lines):
        if "error" in ln.lower():
            return ln[:300]
    return lines[-1][:300] if lines else "no output"


class LiveCluster:
    """Runs a job list on local slots; ``run()`` returns the simulator's ``SimResult``."""

    def __init__(self, topology: Topology, jobs: Sequence[LiveJob], ordering: OrderingPolicy,
                 placement: PlacementPolicy, config: LiveConfig,
                 admission: AdmissionPolicy | None = None) -> None:
        if ordering.preemptive:
            raise ConfigError(f"--policy {ordering.name}: time-sliced (preemptive) policies "
                              f"are not supported in live mode (running training processes "
                              f"are not checkpointed and moved); use fifo or sjf")
        self.topology, self.jobs, self.config = topology, list(jobs), config
        self.core = SchedulerCore(topology, ordering, placement, admission)
        self.running: dict[int, _Proc] = {}
        self.states: dict[int, JobState] = {}
        self.now = 0.0

    # ------------------------------------------------------------------ execution
    def _command(self, job: LiveJob) -> tuple[list[str], Path]:
        out = self.config.out
        cfg_path = out / "configs" / f"{job.spec.name}.json"
        cfg_path.write_text(json.dumps(job.config, indent=2) + "\n")
        return ([self.config.python, "-m", "phalanx.cli", "train", "--config", str(cfg_path),
                 "--out", str(out / "jobs" / job.spec.name), "--workers", str(job.spec.gpus),
                 "--threads", "1", "--no-progress"], out / "logs" / f"{job.spec.name}.log")

    def _start(self, st: JobState, p: Placement) -> None:
        self.core.allocate(st, p)
        job = self._by_id[st.spec.id]
        cmd, log_path = self._command(job)
        env = dict(os.environ)
        # the child imports the same phalanx as this process, whatever its cwd
        root = str(Path(__file__).resolve().parents[2])  # the folder that holds phalanx/
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in p.devices)
        log = log_path.open("wb")
        try:
            popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL)
        except OSError as e:
            log.close()
            self.core.release(st)
            st.start = st.end = self.now
            st.failure = f"cannot start ({e.strerror})"
            self.core.done(st.spec)
            return
        st.running = True
        st.start = st.last_start = self.now
        st.placements.append((self.now, p.devices))
        self.running[st.spec.id] = _Proc(st, popen, log)

    def _reap(self) -> None:
        limit = self.config.job_timeout_s
        for jid, proc in list(self.running.items()):
            st = proc.state
            rc = proc.popen.poll()
            if rc is None and limit and self.now - st.start > limit:
                proc.popen.kill()
                rc = proc.popen.wait()
                st.failure = f"timed out after {limit:g} s"
            if rc is None:
                continue
            proc.log.close()
            del self.running[jid]
            self.core.release(st)
            self.core.done(st.spec)
            st.running = False
            st.end = self.now
            st.executed = st.end - st.start
            st.remaining = 0.0
            if rc != 0 and not st.failure:
                log = self.config.out / "logs" / f"{st.spec.name}.log"
                st.failure = f"exit {rc}: {_last_error_line(log)}"

    # ------------------------------------------------------------------ loop
    def run(self) -> SimResult:
        out = self.config.out
        for sub in ("configs", "jobs", "logs"):
            (out / sub).mkdir(parents=True, exist_ok=True)
        self._by_id = {j.spec.id: j for j in self.jobs}
        res = SimResult([], [], capacity=self.core.cluster.capacity)
        pending = sorted(self.jobs, key=lambda j: (j.spec.submit, j.spec.id))
        t0 = time.monotonic()
        wall0 = time.perf_counter()
        last = (-1, -1)
        c = self.core.cluster
        try:
            while True:
                self.now = time.monotonic() - t0
                while pending and pending[0].spec.submit <= self.now:
                    spec = pending.pop(0).spec
                    res.events += 1
                    arrival = self.core.arrive(spec, self.now)
                    if arrival.state is None:
                        res.rejected.append((spec, arrival.reason))
                        res.oversize += arrival.oversize
                    else:
                        self.states[spec.id] = arrival.state
                n_running = len(self.running)
                self._reap()
                res.events += n_running - len(self.running)
                self.core.fill(self.now, self._start)
                if (c.busy, len(self.core.waiting)) != last:
                    last = (c.busy, len(self.core.waiting))
                    res.times.append(self.now)
                    res.busy.append(c.busy)
                    res.queue.append(len(self.core.waiting))
                    res.frag.append(c.fragmentation)
                if not self.running and not pending:
                    break   # done (anything still waiting could not start on an idle cluster)
                wait = self.config.poll_s
                if pending and not self.running:
                    wait = max(0.0, min(wait, pending[0].spec.submit - self.now))
                time.sleep(wait)
        finally:
            # interrupted (Ctrl-C) or failed: never leave training processes behind
            for proc in self.running.values():
                proc.popen.kill()
                proc.popen.wait()
                proc.log.close()
        res.jobs = [self.states[j.spec.id] for j in self.jobs if j.spec.id in self.states]
        res.fragmentation_blocked = self.core.fragmentation_blocked
        res.wall_s = time.perf_counter() - wall0
        return res
