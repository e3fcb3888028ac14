"""Interval engine: the clock of the Pollux artifact's simulator (petuum/adaptdl,
osdi21-artifact, ``simulator/simulator.py``), reimplemented.

Time moves in fixed steps of ``interval_s`` from 0. At each boundary ``k x interval``
(k >= 1) the engine, in order:
1. advances every job that holds GPUs through the interval just ended (a job that
   finishes inside it records its exact completion time, but its GPUs stay held until
   the boundary);
2. admits the jobs submitted up to the boundary (arrivals are seen only there);
3. asks the policy for the next allocation: a non-elastic ordering + placement (the
   round of ``Simulator``: keep the first jobs of the order that fit by GPU count,
   preempt the rest, place the kept ones that wait), or an elastic policy that returns
   each job's GPU count and batch;
4. charges ``restart_cost_s`` (no progress) to every job whose allocation changed,
   including its first start when ``restart_first``.

Pollux jobs progress in iterations at the application's initial batch, epoch by epoch, at
``gain(batch, epoch) / step_time`` (``PolluxApplication``); like the artifact, the time
to the end of each epoch is rounded to whole seconds. Other jobs (Philly, synthetic)
progress at the perf model's isolated rate.

Interference: with a pair table (``--interference-pairs``, the perf model's ``co``) every
job that holds GPUs progresses through an interval at ``1 / (1 + load)`` of its speed
alone, its load from the jobs beside it at the interval's start
(:func:`phalanx.cluster.model.colocated.pair_loads`, the event engine's pricing plus the
link level). Allocations change only at boundaries, so the load holds for the interval; a
neighbour that ends inside one weighs on the rest until the boundary, as its GPUs stay
held. Without a table (the family sensitivities of the event engine) or with
``--no-interference`` no job is slowed, as in the artifact.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from phalanx.cluster.core.allocator import Placement
from phalanx.cluster.core.cadence import Cadence
from phalanx.cluster.core.jobs import JobSpec, JobState
from phalanx.cluster.core.result import SimResult
from phalanx.cluster.core.scheduler import SchedulerCore
from phalanx.cluster.core.topology import Topology
from phalanx.cluster.core.view import ElasticPolicy, job_view
from phalanx.cluster.model.colocated import pair_loads
from phalanx.cluster.model.interference import kind_of
from phalanx.cluster.model.learned import Learner
from phalanx.cluster.model.perf import PerfModel
from phalanx.cluster.model.profiles import BatchConfig, PolluxApplication
from phalanx.cluster.policies import AdmissionPolicy, OrderingPolicy, Pack, PlacementPolicy
from phalanx.cluster.policies.placement import place_on, place_typed
from phalanx.cluster.sim.event import allocation_shape
from phalanx.errors import ConfigError
from phalanx.metrics import Progress


@dataclass(frozen=True)
class IntervalConfig(Cadence):
    """The engine's cadence (checked by ``Cadence``) and its run switches."""

    progress: bool = False
    check_invariants: bool = False


class _Run:
    """Progress of one admitted job (kept across preemptions)."""

    __slots__ = ("app", "work", "epoch", "progress", "cfg", "step_t", "rate", "restart_left",
                 "counts", "learner", "jid")

    def __init__(self, app: PolluxApplication | None, work: float, learner: Learner | None = None,
                 jid: int = -1) -> None:
        self.app = app
        self.work = work           # non-Pollux jobs: work units
        self.epoch = 0
        self.progress = 0.0        # Pollux: iterations at the initial batch; else work
        self.cfg: BatchConfig | None = None
        self.step_t = 0.0
        self.rate = 0.0            # non-Pollux jobs: work units per second
        self.restart_left = 0.0
        self.counts: tuple[int, ...] = ()
        # a job that learns (the policy's ``learner``): it reports every stretch it trains
        # and re-picks its batch after it, as an AdaptDL job does
        self.learner = learner
        self.jid = jid

    def _report(self) -> None:
        """The set-up just run, its true step and sync time, and the gradient statistics
        at its batch and epoch (``simulator.py:Job.step`` -> ``update_params``)."""
        app, cfg = self.app, self.cfg
        step, sync = app.throughput(self.counts, cfg.atomic)
        self.learner.observe(self.jid, app.name, sum(self.counts), len(self.counts),
                             cfg.atomic, step, sync, app.grad_stats(cfg.batch, self.epoch))

    def rebatch(self) -> None:
        """The batch the job picks for its GPUs now (``Job.update_local_bsz``)."""
        if self.learner is None or self.epoch >= self.app.epochs:
            return
        self.cfg = self.learner.batch_config(self.jid, self.app.name, len(self.counts),
                                             sum(self.counts), *batch_limits(self.app,
                                                                             self.counts))
        self.step_t = run_step_time(self.app, self.counts, self.cfg)

    def remaining(self, spec: JobSpec) -> float:
        if self.app is None:
            return self.work - self.progress
        return float(self.app.epoch_end[-1] - self.progress)

    def advance(self, t: float, dt: float, speed: float = 1.0) -> float | None:
        """Run ``dt`` seconds from ``t`` at ``speed`` x its speed alone (interference);
        the completion time if the job ends."""
        d = min(self.restart_left, dt)
        self.restart_left -= d
        t, dt = t + d, dt - d
        if self.app is None:
            if dt <= 0:
                return None
            rate = self.rate * speed
            need = (self.work - self.progress) / rate
            if need <= dt:
                self.progress += need * rate
                return t + need
            self.progress += dt * rate
            return None
        app = self.app
        while dt > 0:
            if self.learner is not None:
                self._report()
            g = app.gain(self.cfg.batch, self.epoch) / self.step_t * speed
            nxt = float(app.epoch_end[self.epoch + 1])
            if self.progress + g * dt < nxt:
                self.progress += g * dt
                self.rebatch()
                return None
            # the artifact rounds the time to each epoch's end to whole seconds
            delta = min(float(round((nxt - self.progress) / g)), dt)
            self.progress = nxt
            self.epoch += 1
            t, dt = t + delta, dt - delta
            if self.epoch >= app.epochs:
                return t
            self.rebatch()
        return None


def run_step_time(app: PolluxApplication, counts: tuple[int, ...], cfg: BatchConfig) -> float:
    """Seconds per step as the job runs it: the profile's, times the application's
    calibration slowdown (1 but for Sia's applications)."""
    return app.config_step_time(counts, cfg) * app.slowdown


def batch_limits(app: PolluxApplication, counts: tuple[int, ...]
                 ) -> tuple[float | None, float | None]:
    """The per-GPU batch limits a job obeys on this placement: a per-type (Sia) profile's
    (``local_limits``); none beyond the application's for a Pollux one."""
    return app.local_limits(counts) if app.device_type else (None, None)


def placement_types(topology: Topology, devices: Sequence[int]) -> set[str]:
    return {topology.servers[topology.device_server[d]].device_type for d in devices}


def _counts_in_order(topology: Topology, p: Placement) -> tuple[int, ...]:
    """GPUs per server in the order the placement took them (the artifact keys a
    placement by this order's smallest rotation)."""
    seen: dict[int, int] = {}
    for d in p.devices:
        s = topology.device_server[d]
        seen[s] = seen.get(s, 0) + 1
    return tuple(seen.values())


class IntervalSimulator:
    """The interval engine: owns the clock (fixed boundaries, arrivals and completions seen
    there), each job's progress (Pollux applications epoch by epoch, at the batch its
    allocation gives it), restart costs, and how a round's ``Decision`` is applied
    (``_start``, ``_stop``). The rounds themselves are the ``SchedulerCore``'s."""

    def __init__(self, topology: Topology, jobs: Sequence[JobSpec], ordering: OrderingPolicy,
                 placement: PlacementPolicy, perf: PerfModel,
                 admission: AdmissionPolicy | None = None,
                 config: IntervalConfig | None = None,
                 elastic: ElasticPolicy | None = None) -> None:
        self.topology, self.specs = topology, sorted(jobs, key=lambda s: (s.submit, s.id))
        self.ordering, self.placement = ordering, placement
        self.perf, self.config = perf, config if config is not None else IntervalConfig()
        self.elastic = elastic
        self.core = SchedulerCore(topology, ordering, placement, admission, elastic)
        self.cluster = self.core.cluster
        self.states: dict[int, JobState] = self.core.states
        self.runs: dict[int, _Run] = {}
        self.running: dict[int, JobState] = {}
        self.now = 0.0
        if elastic is not None:
            bad = sorted({s.model for s in jobs if not perf.is_step_based(s)})
            if bad:
                raise ConfigError(f"--policy {elastic.name}: needs Pollux applications (with "
                                  f"placement and validation profiles), not {', '.join(bad)}")

    # ------------------------------------------------------------------ start / stop
    def _set_speed(self, st: JobState, run: _Run, p: Placement, cfg: BatchConfig | None
                   ) -> None:
        run.counts = _counts_in_order(self.topology, p)
        if run.app is not None and self.perf.typed:
            types = placement_types(self.topology, p.devices)
            if len(types) > 1:
                raise ConfigError(f"job {st.spec.name}: a gang across GPU types "
                                  f"{', '.join(sorted(types))} is refused: the model has "
                                  f"one profile per type and cannot price a mixed gang "
                                  f"(a job runs on one type at a time, as in Sia)")
            (dtype,) = types
            run.app = self.perf.app_on(st.spec.model, dtype)
            if self.elastic is not None:
                run.learner = self.elastic.learner_for(dtype)
        if run.app is not None and run.learner is not None and cfg is None:
            # the job picks its batch for the new GPUs (``Job.reallocate``)
            run.cfg = run.learner.batch_config(st.spec.id, run.app.name, len(run.counts),
                                               len(p.devices),
                                               *batch_limits(run.app, run.counts))
            run.step_t = run_step_time(run.app, run.counts, run.cfg)
        elif run.app is not None:
            run.cfg = cfg or run.app.batch_config(len(p.devices), st.spec.batch_size)
            run.step_t = run_step_time(run.app, run.counts, run.cfg)
        else:
            shape, _ = allocation_shape(self.topology, self.perf, st.spec, p)
            run.rate = self.perf.isolated_rate(st.spec, shape, self.topology)

    def _start(self, st: JobState, p: Placement, cfg: BatchConfig | None = None) -> None:
        self.core.allocate(st, p)
        run = self.runs[st.spec.id]
        self._set_speed(st, run, p, cfg)
        first = st.start < 0
        cost = self.config.restart_cost_s
        if run.app is not None and run.app.restart_s is not None and self.perf.typed:
            cost = run.app.restart_s      # Sia's checkpoint-restore time of the application
        run.restart_left = cost if (self.config.restart_first or not first) else 0.0
        self.core.started(st, p.devices, self.now)
        self.running[st.spec.id] = st

    def _stop(self, st: JobState, at: float | None = None) -> None:
        self.core.stopped(st, self.now if at is None else at)
        del self.running[st.spec.id]

    def _preempt(self, st: JobState) -> None:
        self._stop(st)
        self.core.preempted(st, self.now)

    def _speeds(self) -> dict[int, float]:
        """Each running job's share of its speed alone over the coming interval: ``1 / (1
        + load)`` by the pair table (see the module doc); none without one."""
        co = self.perf.co
        if co is None or not self.perf.options.interference or len(self.running) < 2:
            return {}
        kinds = {jid: kind_of(st.spec.model, st.spec.kind) for jid, st in self.running.items()}
        return {jid: 1.0 / (1.0 + load) for jid, load in pair_loads(self.cluster, kinds,
                                                                    co).items()}

    # ------------------------------------------------------------------ policies
    def _round(self) -> None:
        """Non-elastic: the core's preemptive round at every boundary (a FIFO-like
        ordering only fills)."""
        if not self.ordering.preemptive:
            self.core.fill(self.now, self._start)
            return
        d = self.core.preemptive_round(self.running.values(), self.now)
        if d is not None:     # stopped at once: the kept ones start on what they freed
            for jid in d.stop:
                self._preempt(self.running[jid])
            self.core.try_start(d.start, self._start)

    def _elastic_round(self) -> None:
        views = [job_view(st, self.topology, self.elastic, held=st.running,
                          epoch=self.runs[jid].epoch,
                          remaining=self.runs[jid].remaining(st.spec),
                          restarting=self.runs[jid].restart_left > 0)
                 for jid, st in list(self.running.items()) + list(self.core.waiting.items())]
        d = self.core.elastic_round(views, self.cluster.capacity, self.now)
        for ch in d.changes:
            st, c = self.states[ch.job], ch.choice
            if ch.kind == "keep":
                run = self.runs[ch.job]
                if c.gpus and c.config is not None and c.config != run.cfg:
                    # a new batch on the same GPUs: re-scaled between steps, no restart
                    run.cfg = c.config
                    run.step_t = run_step_time(run.app, run.counts, c.config)
            elif ch.kind == "vacate":
                self._preempt(st)
            elif st.running:       # a move: what it holds is released before any placing
                self._stop(st)
                self.core.enqueue(st)
        pack = Pack()
        for ch in d.place:         # biggest first (core.placement_order)
            st, c = self.states[ch.job], ch.choice
            if c.servers:
                p = place_on(self.cluster, st.spec, c.servers)
            elif c.device_type:
                p = place_typed(self.cluster, st.spec, c.gpus, c.device_type)
            else:
                p = pack.place(replace(st.spec, gpus=c.gpus), self.cluster)
            if p is not None:
                self._start(st, p, c.config)

    # ------------------------------------------------------------------ loop
    def run(self) -> SimResult:
        t0 = time.perf_counter()
        c, cfg = self.cluster, self.config
        step = cfg.interval_s
        res = self.core.result
        specs, nxt = self.specs, 0
        progress = Progress(len(specs), "simulate", enabled=cfg.progress)
        done = 0
        while True:
            # 1. the interval just ended
            finished = []
            speeds = self._speeds()
            for jid, st in self.running.items():
                run = self.runs[jid]
                end = run.advance(self.now, step, speeds.get(jid, 1.0))
                held = step if end is None else end - self.now
                self.core.serve(st, held, len(st.placements[-1][1]))
                st.service_marks.append((self.now + step, st.attained))
                if end is not None:
                    finished.append((st, end))
            self.now += step
            res.events += 1
            for st, end in finished:
                self._stop(st, end)
                self.core.ended(st, end)
                if self.runs[st.spec.id].learner is not None:
                    self.runs[st.spec.id].learner.forget(st.spec.id)
                if self.elastic is not None:
                    self.elastic.finished(st.spec.id)
                done += 1
            # 2. arrivals up to this boundary
            while nxt < len(specs) and specs[nxt].submit <= self.now:
                self._arrive(specs[nxt])
                nxt += 1
            # 3. the policy's next allocation
            if self.elastic is not None:
                self._elastic_round()
            else:
                self._round()
            if cfg.check_invariants:
                c.check_invariants()
            self.core.sample(self.now, every=True)
            if done % 64 == 0:
                progress.update(done + len(res.rejected), clock_h=self.now / 3600)
            if not self.running:
                if nxt >= len(specs):
                    break    # nothing runs, nothing will arrive: waiting jobs never fit
                if not self.core.waiting:
                    # idle: jump to the boundary of the next arrival
                    k = math.ceil(specs[nxt].submit / step) - 1
                    self.now = max(self.now, k * step)
        progress.update(len(specs))
        progress.close()
        res = self.core.finish(self.specs, time.perf_counter() - t0)
        res.jobs.sort(key=lambda st: st.spec.id)
        return res

    def _arrive(self, spec: JobSpec) -> None:
        if self.elastic is not None:
            # the elastic policy picks the GPU count: the trace's gang size is ignored
            spec = replace(spec, gpus=1, requested=spec.requested or spec.gpus)
        if self.core.submit(spec, self.now) is None:
            return
        app = self.perf.pollux.get(spec.model) if self.perf.is_step_based(spec) else None
        learner = (self.elastic.learner_for("") if app is not None and self.elastic is not None
                   else None)
        self.runs[spec.id] = _Run(app, spec.work, learner, spec.id)
