"""Live mode: the scheduler runs real training jobs through an executor (local slots or a
Ray cluster) with the simulator's policies.

The queue, admission and the fill pass are the simulator's (``SchedulerCore``), with the
same ordering and placement objects on the same ``ClusterState``; only the clock (wall time
since start) and execution differ. A placed job becomes a gang (:mod:`launch_plan`) that
the executor (:mod:`executor`) starts on exactly the devices the placement chose.

Time-sliced orderings (``las``, ``tiresias``, ``rr``) run a *round* every ``round_s``
seconds, as in the simulator: order every active job, keep the first that fit (a running
job that cannot be preempted is always kept), stop the other running ones. A stop is
SIGTERM to every rank: ranks checkpoint at one step and exit (:mod:`phalanx.runtime.preempt`);
the job then waits in the queue until a later round starts it (from its checkpoint), or
until the cluster is idle with jobs waiting, when a round is made at once.

Outputs are the simulator's ``summary.json`` and ``jobs.csv`` (real times, seconds after
start; every placement; preemptible or why not) plus each job's run folder
(``OUT/jobs/NAME``), log (``OUT/logs/NAME.log``) and rank records (``OUT/ranks/NAME.jsonl``).

The loop saves its state (``OUT/scheduler-state.json``, :mod:`state`) after every change and
at least every second; ``--resume OUT`` builds the loop from it (:func:`restart.restore`):
finished jobs stay finished, the clock goes on from where it stopped, and a job that ran
when the scheduler died resumes from its checkpoint.

Lost servers: the engine reports the servers whose node died or left (``Executor.down``:
Ray's raylet gone, a Slurm node down). Their devices go out of service (held in the
``ClusterState`` so that no policy places on them); a job with a rank there is stopped
(its ranks elsewhere have lost a peer) and waits to resume from its last checkpoint on the
devices left. This is neither a failure (``--max-job-restarts`` is not charged) nor a
preemption. When the node comes back its devices are free again.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass

from phalanx.cluster.core.allocator import Placement
from phalanx.cluster.core.jobs import JobState
from phalanx.cluster.core.result import SimResult
from phalanx.cluster.core.scheduler import SchedulerCore
from phalanx.cluster.core.topology import Topology
from phalanx.cluster.live.config import LiveConfig
from phalanx.cluster.live.engines.base import Executor, Gang
from phalanx.cluster.live.engines.local import LocalExecutor
from phalanx.cluster.live.exits import Exit, Outcome, classify, failure_line, lost_line
from phalanx.cluster.live.joblist import LiveJob
from phalanx.cluster.live.launch_plan import JobPlan, build_gang, plan_of, resumable
from phalanx.cluster.live.restart import Progress, Saver, restore
from phalanx.cluster.live.state import SavedState
from phalanx.cluster.policies import AdmissionPolicy, OrderingPolicy, PlacementPolicy
from phalanx.cluster.policies.placement import OneType
from phalanx.runtime import first_failure


def type_order(topology: Topology) -> tuple[str, ...]:
    """The cluster's device types, fastest first (declared speed, then emulated slowdown)."""
    return tuple(sorted({s.device_type for s in topology.servers},
                        key=lambda t: (-topology.device_types[t].speed,
                                       topology.device_types[t].slowdown, t)))


LOST_GRACE_S = 2.0   # a job that lost a server: its other ranks' time to go before SIGKILL


@dataclass
class _Run:
    """One start of a job."""

    state: JobState
    gang: Gang
    since: float
    stop: str = ""                  # why stopped: '' running, 'preempt', 'timeout', 'lost'
    asked: float = 0.0              # when
    log_from: int = 0               # the gang's log up to here is earlier starts'


@dataclass(frozen=True)
class StopRecord:
    """A preemption as the loop saw it (what bench/live.py times)."""

    job: str
    asked: float                    # seconds after start: SIGTERM sent
    exited: float                   # every rank gone, devices free
    code: int


class LiveCluster:
    """The live engine: owns the wall clock, each job's gang and its executor (start, stop
    with a grace period, poll), and what a stop means (back to the queue to resume, or
    done). The queue, the fill pass and the rounds are the ``SchedulerCore``'s; ``run()``
    returns the simulator's ``SimResult``."""

    def __init__(self, topology: Topology, jobs: Sequence[LiveJob], ordering: OrderingPolicy,
                 placement: PlacementPolicy, config: LiveConfig,
                 admission: AdmissionPolicy | None = None,
                 executor: Executor | None = None, resume: SavedState | None = None) -> None:
        self.topology, self.config = topology, config
        self.resume = resume            # the state of a killed scheduler to continue
        self.plans: dict[int, JobPlan] = {j.spec.id: plan_of(j) for j in jobs}
        # each entry declares its own application facts (its batch): for an elastic policy a
        # live job is its own application
        self.jobs = [dataclasses.replace(j, spec=dataclasses.replace(
            j.spec, not_preemptible=self.plans[j.spec.id].why_not,
            app=j.spec.app or j.spec.name)) for j in jobs]
        self.ordering = ordering
        self.executor: Executor = executor if executor is not None else LocalExecutor(
            config.python)
        if topology.typed:
            # a gang runs on one device type at a time (fastest type first where the
            # placement policy's own choice spans types)
            placement = OneType(placement, type_order(topology))
        self.core = SchedulerCore(topology, ordering, placement, admission)
        self.runs: dict[int, _Run] = {}
        self.states: dict[int, JobState] = self.core.states
        self.benched: set[int] = set()      # not kept by the last round: wait for the next
        self.stops: list[StopRecord] = []
        self.decisions: list[float] = []    # seconds each round / fill pass took
        self.start_s: list[tuple[str, float]] = []   # seconds each executor.start took
        self.round_times: list[float] = []  # seconds each round (the policy's decision) took
        self.round_s = ordering.round_s if ordering.preemptive else None
        self.now = 0.0
        self.lost: set[int] = set()           # servers lost now
        self._holds: dict[int, list[int]] = {}  # lost server -> allocations holding its devices
        self._hold_ids = itertools.count(-1, -1)
        self._lost_wait_from: float | None = None   # since when only lost servers hold jobs

    # ------------------------------------------------------------------ execution
    def _start(self, st: JobState, p: Placement) -> None:
        self.core.allocate(st, p)
        job = self._by_id[st.spec.id]
        plan = self.plans[st.spec.id]
        out = self.config.out
        run_dir = out / "jobs" / job.spec.name
        again = st.start >= 0      # preempted, restarted, or running when the scheduler died
        resume = again and resumable(job, run_dir)
        if again and not resume:
            shutil.rmtree(run_dir, ignore_errors=True)   # stopped before it began: anew
        dtype = self.topology.gang_type(p.devices)   # one type (mixed gangs are refused)
        gang = build_gang(job, plan, self.topology, p.devices, len(st.placements), out, resume,
                          workers=st.spec.gpus,
                          slowdown=self.topology.device_types[dtype].slowdown
                          if self.topology.emulated else None)
        try:
            log_from = gang.log.stat().st_size
        except OSError:
            log_from = 0
        gang.claim.unlink(missing_ok=True)   # a killed scheduler's start may have left one
        t = time.perf_counter()
        try:
            self.executor.start(gang)
        except OSError as e:
            self._watch()
            self.core.release(st)
            if self._servers(p.devices) & self.lost:
                self.core.enqueue(st)    # its server was lost as it started: it waits
                return
            self.core.ended(st, self.now, f"cannot start ({e.strerror or e})")
            return
        # the engine's own cost of a start (the ranks' Python start-up runs after it)
        self.start_s.append((job.spec.name, time.perf_counter() - t))
        self.core.started(st, p.devices, self.now)
        st.last_update = self.now
        self.runs[st.spec.id] = _Run(st, gang, self.now, log_from=log_from)

    def _account(self) -> None:
        """Executed time and attained GPU-seconds of running jobs, up to now (for LAS)."""
        for run in self.runs.values():
            self.core.catch_up(run.state, self.now)

    def _stop(self, run: _Run, why: str, grace_s: float | None = None) -> None:
        if run.stop:
            return
        run.stop, run.asked = why, self.now
        self.executor.stop(run.gang.job, self.config.grace_s if grace_s is None else grace_s)

    # ------------------------------------------------------------------ lost servers
    def _servers(self, devices: Sequence[int]) -> set[int]:
        return {self.topology.device_server[d] for d in devices}

    def _watch(self) -> None:
        """Follow the servers the engine reports lost: a newly lost one's jobs are stopped
        (to resume elsewhere), its free devices held; a server back is free again."""
        index = {s.name: s.index for s in self.topology.servers}
        lost = {index[n] for n in self.executor.down() if n in index}
        servers = self.topology.servers
        for s in sorted(lost - self.lost):
            hit = [r for r in self.runs.values()
                   if s in self._servers(r.state.placements[-1][1])]
            names = ", ".join(r.state.spec.name for r in hit)
            print(f"phalanx: scheduler: server {servers[s].name} lost: its devices are out "
                  f"of service{f'; {names} will resume from a checkpoint' if hit else ''}",
                  flush=True)
            for r in hit:
                # its ranks elsewhere lost a peer: no checkpoint will come on SIGTERM
                self._stop(r, "lost", grace_s=LOST_GRACE_S)
        for s in sorted(self.lost - lost):
            for hold in self._holds.pop(s, []):
                self.core.cluster.release(hold)
            print(f"phalanx: scheduler: server {servers[s].name} is back", flush=True)
        self.lost = lost
        self._hold_lost()

    def _hold_lost(self) -> None:
        """Hold what the lost servers' jobs have freed since (before any fill pass)."""
        c = self.core.cluster
        for s in self.lost:
            free = c.free_devices(s)
            if free and c.cores_free[s]:
                hold = next(self._hold_ids)
                c.allocate(hold, Placement(tuple(free), ((s, c.cores_free[s]),)))
                self._holds.setdefault(s, []).append(hold)

    def _wait_for_lost(self) -> bool:
        """Nothing runs and nothing is still to arrive, yet jobs wait that the lost servers
        hold up (each fits the whole cluster, which rejected none of them): wait for the
        servers to come back, at most ``lost_wait_s``; then those jobs fail with one line
        each. True while the loop should wait."""
        waiting = list(self.core.waiting.values())
        if not waiting or not self.lost:
            return False
        servers = self.topology.servers
        names = ", ".join(servers[s].name for s in sorted(self.lost))
        limit = self.config.lost_wait_s
        if self._lost_wait_from is None:
            self._lost_wait_from = self.now
            print(f"phalanx: scheduler: {', '.join(st.spec.name for st in waiting)} "
                  f"wait(s) for lost server(s) {names} to come back (at most {limit:g} s, "
                  "--lost-wait)", flush=True)
        if self.now - self._lost_wait_from < limit:
            return True
        for st in waiting:
            self.core.abandon(st)    # out of the queue, its quota given back
            st.end, st.remaining = self.now, 0.0
            st.failure = (f"could not {'resume' if st.start >= 0 else 'start'}: "
                          f"server(s) {names} lost for {limit:g} s (--lost-wait)")
        return False

    def _reap(self) -> int:
        """Poll every gang; apply each exit's outcome (:func:`exits.classify`)."""
        limit = self.config.job_timeout_s
        ended = 0
        for run in list(self.runs.values()):
            if limit and not run.stop and self.now - run.state.start > limit:
                self._stop(run, "timeout")
            rc = self.executor.poll(run.gang.job)
            if rc is not None:
                ended += 1
                self._ended(run, rc)
        return ended

    def _ended(self, run: _Run, rc: int) -> None:
        """A gang ended with ``rc``: its devices are free; the job waits again (a server
        lost, a preemption, a restart after a failure) or is done (finished, timed out,
        failed)."""
        st = run.state
        first = self.executor.failed.pop(run.gang.job, None)
        self._account()
        del self.runs[st.spec.id]
        self.core.stopped(st, self.now)
        if run.stop:
            self.stops.append(StopRecord(st.spec.name, run.asked, self.now, rc))
        if rc != 0 and not run.stop:
            self._watch()   # did it end because its server was lost?
        outcome = classify(Exit(
            run.stop, rc, bool(self._servers(st.placements[-1][1]) & self.lost),
            (self.config.out / "jobs" / st.spec.name / "summary.json").is_file()),
            st.restarts, self.config.max_job_restarts)
        if outcome is Outcome.LOST:
            # not its failure: it waits to resume from its checkpoint on what is left
            if run.stop != "lost":   # it ended before _watch stopped (and named) it
                print(lost_line(st.spec.name, sorted(self.topology.servers[s].name for s in
                      self._servers(st.placements[-1][1]) & self.lost)), flush=True)
            self.core.requeue(st, self.now)
        elif outcome is Outcome.PREEMPTED:
            # stopped on request (a checkpoint written, or killed before one was due):
            # back to the queue; the next start resumes from what is on disk
            st.preemptions += 1
            st.waiting_since = self.now
            self.core.enqueue(st)           # it waits for a round
            self.benched.add(st.spec.id)
        elif outcome is Outcome.TIMEOUT:
            self.core.ended(st, self.now, f"timed out after {self.config.job_timeout_s:g} s")
        elif outcome is Outcome.DONE:
            self.core.ended(st, self.now)
        else:
            rank, code = first_failure.cause(first or (), first_failure.read(
                run.gang.claim)) or (0, rc)
            line = failure_line(run.gang.log, run.log_from, rank, code)
            if outcome is Outcome.RESTART:
                # a rank died or could not join: the job starts again (from its checkpoint
                # when it has one), on whatever placement it gets then
                st.restarts += 1
                print(f"phalanx: scheduler: {st.spec.name} failed ({line}); starting it "
                      f"again ({st.restarts} of {self.config.max_job_restarts})", flush=True)
                self.core.requeue(st, self.now)
            else:
                self.core.ended(st, self.now, line + (
                    f" (after {st.restarts} restart{'s' if st.restarts > 1 else ''})"
                    if st.restarts else ""))

    # ------------------------------------------------------------------ decisions
    def _round(self) -> None:
        """The core's preemptive round: the running jobs it does not keep are stopped (they
        leave when their ranks are gone); the waiting ones it does not keep wait for the
        next round. The kept ones start in the fill pass that follows."""
        self._account()
        live = [r.state for r in self.runs.values() if not r.stop]
        d = self.core.preemptive_round(live, self.now)
        if d is not None:
            # a stop is asynchronous: the kept jobs start in the fill passes that follow,
            # once the stopped ones' ranks are gone and their devices free
            for jid in d.stop:
                self._stop(self.runs[jid], "preempt")
            self.benched = {j for j in self.core.waiting if j not in d.kept}

    def _fill(self) -> None:
        if not self.round_s:
            self.core.fill(self.now, self._start)
            return
        if not self.runs:
            self.benched.clear()    # nothing runs: no reason to wait for the next round
        waiting = [st for jid, st in self.core.waiting.items() if jid not in self.benched]
        if waiting:
            self.core.try_start(self.ordering.order(waiting, self.now), self._start)

    # ------------------------------------------------------------------ loop
    def _progress(self) -> Progress:
        """What the saver records beside the core's states (:class:`restart.Progress`)."""
        servers = self.topology.servers
        return Progress(self.now, tuple(self.runs), tuple(r.stop for r in self.runs.values()),
                        frozenset(self.benched), len(self.round_times),
                        tuple(servers[s].name for s in sorted(self.lost)))

    def run(self) -> SimResult:
        out = self.config.out
        for sub in ("configs", "jobs", "logs", "ranks"):
            (out / sub).mkdir(parents=True, exist_ok=True)
        for job in self.jobs:
            path = out / "configs" / f"{job.spec.name}.json"
            path.write_text(json.dumps(job.config, indent=2) + "\n")
        self._by_id = {j.spec.id: j for j in self.jobs}
        res = self.core.result
        pending = sorted(self.jobs, key=lambda j: (j.spec.submit, j.spec.id))
        clock = 0.0
        if self.resume is not None:
            restored = restore(self.core, self.jobs, self.config, self.executor, self.resume)
            pending, clock = restored.pending, self.resume.clock
            self.benched = set(restored.benched)
        saver = Saver(self.core, self.jobs, self.topology, out)
        round_s = self.round_s
        next_round = clock + round_s if round_s else float("inf")
        t0 = time.monotonic() - clock   # a resumed schedule's clock goes on where it stopped
        wall0 = time.perf_counter()
        idle_round = False   # a round was made with the cluster idle and jobs waiting
        try:
            while True:
                self.now = time.monotonic() - t0
                while pending and pending[0].spec.submit <= self.now:
                    res.events += 1
                    self.core.submit(pending.pop(0).spec, self.now)
                self._watch()
                res.events += self._reap()
                self._hold_lost()   # what the jobs that just ended freed on lost servers
                t = time.perf_counter()
                if self.now >= next_round:
                    self._round()
                    self.round_times.append(time.perf_counter() - t)
                    next_round = self.now + round_s
                self._fill()
                self.decisions.append(time.perf_counter() - t)
                self.core.sample(self.now)
                if not self.runs and not pending:
                    if self._wait_for_lost():
                        saver.save(self._progress(), pending)
                        time.sleep(self.config.poll_s)
                        continue
                    if round_s and self.core.waiting and not idle_round:
                        # jobs wait on an idle cluster (held back for jobs since ended)
                        next_round, idle_round = self.now, True
                        continue
                    saver.save(self._progress(), pending, finished=True)
                    break   # done (anything still waiting could not start on an idle cluster)
                idle_round = False
                self._lost_wait_from = None
                saver.save(self._progress(), pending)
                wait = self.config.poll_s
                if pending and not self.runs:
                    wait = max(0.0, min(wait, pending[0].spec.submit - self.now))
                time.sleep(wait)
        finally:
            # interrupted (Ctrl-C) or failed: never leave training processes behind
            self.executor.close()
        return self.core.finish([j.spec for j in self.jobs], time.perf_counter() - wall0)
