"""``phalanx schedule --policy goodput``: the learned goodput policy on live jobs, with
elastic resize.

Every ``interval_s`` seconds, as the interval engine does in simulation:

1. **Observe.** Each running job's rank 0 (a parameter-server job: worker 0) reports its
   step and sync times at its current (workers, nodes, per-worker batch) and its gradient
   noise (``perf`` / ``noise`` events, :mod:`phalanx.metrics.noise`; a BSP parameter
   server's shards: ``noise_part``, :mod:`phalanx.ps.noise_part`; the other
   parameter-server models have none, and the policy goes by their throughput).
   Each set-up measured over :data:`observe.WINDOWS` windows is fed to the learned model
   (:class:`~phalanx.cluster.model.learned.Learner`): the Pollux artifact's throughput model,
   fitted to what the job ran, never to a table of its true speed. The fitted model goes
   into the job's log (``OUT/logs/NAME.log``), with its prediction against the
   measurement.
2. **Allocate.** ``LearnedGoodputPolicy.allocate`` (the simulator's policy object) gives
   each resizable job a GPU count: a job never run gets one GPU, a job may grow to twice
   the most it has run on, a change must pay its restart back.
3. **Resize.** A job whose count changes is stopped (SIGTERM: sync / average checkpoint at
   one step; a parameter-server job keeps its last periodic checkpoint), its run folder is
   rewritten for the new workers and the batch the model picks for them
   (:func:`~phalanx.cluster.live.resize.resize_run`), and it resumes from that checkpoint on the
   placement the placement policy finds.

What a job's application "declares" (Pollux's facts) comes from its job-list entry: the
initial batch is ``batch_size x gpus``; a worker's batch may range over
``[batch_size / 2, 2 x batch_size]``; the total batch up to ``2 x batch_size`` x the
cluster's devices. A parameter-server job is resized in its workers (its shards stay;
:mod:`~phalanx.cluster.live.resize_ps`). Jobs that cannot be resized (single, Hogwild!, the
stage strategies, SandBlaster, or a job that cannot be preempted) keep their declared
gang and run first come, first served on the devices the resizable jobs were not given;
the CLI prints why each is not resizable.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from phalanx.cluster.core.cadence import Cadence
from phalanx.cluster.core.jobs import JobState
from phalanx.cluster.core.topology import Topology
from phalanx.cluster.core.view import Choice, job_view
from phalanx.cluster.live.engines.base import Executor
from phalanx.cluster.live.joblist import LiveJob
from phalanx.cluster.live.launch_plan import resumable
from phalanx.cluster.live.loop import LiveCluster, LiveConfig
from phalanx.cluster.live.observe import WINDOWS, EventTail, JobObserver, Observation
from phalanx.cluster.live.resize import resize_run
from phalanx.cluster.live.resize_ps import refusal
from phalanx.cluster.live.state import SavedState
from phalanx.cluster.model.core_share import CoreShare
from phalanx.cluster.model.learned import AppFacts, JobKnowledge
from phalanx.cluster.policies import FIFO, PlacementPolicy
from phalanx.cluster.policies.goodput_learned import LearnedGoodputPolicy
from phalanx.config import RunConfig
from phalanx.errors import ConfigError
from phalanx.parallel.registry import spec
from phalanx.settings import parse_device


def job_facts(job: LiveJob, capacity: int) -> AppFacts:
    b = int(RunConfig.from_mapping(job.config, source=job.spec.name).batch_size)
    return AppFacts(job.spec.name, init_batch=b * job.spec.gpus, max_batch=2 * b * capacity,
                    min_local_bsz=max(1, b // 2), max_local_bsz=2 * b, epochs=1)


def describe(k: JobKnowledge, name: str) -> str:
    p = k.params
    assert p is not None
    terms = " ".join(f"{f}={getattr(p, f):.4g}" for f in p._fields)
    seen = ", ".join(f"{g} GPU x {n} node x batch {b:g}" for n, g, b in sorted(k.profile))
    return f"phalanx: scheduler: {name}: step-time model fitted to [{seen}]: {terms}"


class ElasticLiveCluster(LiveCluster):
    """The live engine under the learned goodput policy: observes each job's steps and
    gradient noise, and applies the core's elastic round by stopping a job and resuming it
    from its checkpoint rewritten for its new size (its strategy's resize hook)."""

    def __init__(self, topology: Topology, jobs: Sequence[LiveJob],
                 placement: PlacementPolicy, config: LiveConfig, cadence: Cadence,
                 horizon_s: float = 1800.0, executor: Executor | None = None,
                 cores: CoreShare | None = None, resume: SavedState | None = None) -> None:
        # ``resume``: what the policy learned is not saved; it observes the jobs anew
        super().__init__(topology, jobs, FIFO(), placement, config, executor=executor,
                         resume=resume)
        self.round_s = cadence.interval_s
        cap = topology.num_devices
        self.why_fixed = {j.spec.id: self._why_fixed(j) for j in self.jobs}
        elastic = [j for j in self.jobs if not self.why_fixed[j.spec.id]]
        self.policy = LearnedGoodputPolicy({j.spec.application: job_facts(j, cap)
                                            for j in elastic},
                                           node_gpus=max(topology.server_size),
                                           restart_s=cadence.restart_cost_s,
                                           horizon_s=horizon_s)
        self.core.elastic = self.policy
        # CPU jobs' ranks share their machines' cores (``cores``: None, never crowded)
        self.cores = cores
        self.on_cpu = {j.spec.id: parse_device(RunConfig.from_mapping(
            j.config, source=j.spec.name).device).kind == "cpu" for j in self.jobs}
        if cores is not None:
            self.policy.slowdown = self._slowdown_at
        self.observers = {j.spec.id: JobObserver(EventTail(
            config.out / "jobs" / j.spec.name / "events.jsonl")) for j in elastic}
        self.target: dict[int, int] = {}
        self.predicted: dict[int, tuple[tuple[int, int, int], float]] = {}
        self.resizes: list[tuple[str, float, int, int]] = []   # (job, time, from, to)
        # per job: predicted / measured - 1 of every window after its set-up was fitted
        self.held_out: dict[int, list[float]] = {}

    def _why_fixed(self, job: LiveJob) -> str:
        plan = self.plans[job.spec.id]
        if not plan.preemptible:
            return f"not preemptible ({plan.why_not})"
        if not plan.per_rank and not spec(plan.strategy).is_parameter_server:
            return f"--strategy {plan.strategy}: its workers are not resizable"
        if not plan.per_rank:
            return refusal(RunConfig.from_mapping(job.config, source=job.spec.name))
        return ""

    def _note(self, st: JobState, line: str) -> None:
        with open(self.config.out / "logs" / f"{st.spec.name}.log", "a") as f:
            f.write(line + "\n")

    # ------------------------------------------------------------------ CPU cores
    def _demand(self, skip: int = -1) -> list[int]:
        """Ranks of running CPU jobs per machine (without job ``skip``'s)."""
        assert self.cores is not None
        return self.cores.demand((s.server, 1) for jid, r in self.runs.items()
                                 if jid != skip and self.on_cpu[jid] for s in r.gang.ranks)

    def _slowdown_now(self, jid: int) -> float:
        """How much slower job ``jid`` steps now for want of cores (1: not at all)."""
        if self.cores is None or not self.on_cpu[jid]:
            return 1.0
        return self.cores.slowdown({s.server for s in self.runs[jid].gang.ranks},
                                   self._demand())

    def _slowdown_at(self, jid: int, n: int) -> float:
        """The same on ``n`` ranks, beside the other jobs running now."""
        if self.cores is None or not self.on_cpu[jid]:
            return 1.0
        return self.cores.predict(n, dict(enumerate(self._demand(skip=jid))),
                                  self.policy.node_gpus)

    # ------------------------------------------------------------------ observations
    def _observe(self) -> None:
        for jid, run in self.runs.items():
            obs = self.observers.get(jid)
            if obs is None:
                continue
            nodes = len({s.server for s in run.gang.ranks})
            # times are taken in per whole core (divided by the slowdown), predictions
            # times the slowdown where they apply
            ready, fresh = obs.read(nodes, self._slowdown_now(jid))
            k = self.policy.learner.knowledge(jid, run.state.spec.application)
            for w in fresh:
                # a window measured after the model was fitted to its set-up: the fit's
                # prediction, held out in time, against what was measured
                g, n, b = w.key
                if w.index >= WINDOWS and k.params is not None and (n, g, float(b)) in k.profile:
                    self.held_out.setdefault(jid, []).append(k.predict(g, n, b) / w.step_s - 1)
            for o in ready:
                self._learn(run.state, obs, o)

    def _learn(self, st: JobState, obs: JobObserver, o: Observation) -> None:
        name = st.spec.name
        app = st.spec.application
        facts = self.policy.learner.facts[app]
        self.policy.learner.observe(st.spec.id, app, o.gpus, o.nodes, o.batch, o.step_s,
                                    o.sync_s, obs.grad(facts.init_batch), replace=True)
        k = self.policy.learner.knowledge(st.spec.id, app)
        key = (o.gpus, o.nodes, o.batch)
        x = self._slowdown_now(st.spec.id)
        fit, measured = k.predict(o.gpus, o.nodes, o.batch) * x, o.step_s * x
        line = (f"{describe(k, name)}; at {o.gpus} GPU x {o.nodes} node x batch {o.batch} "
                f"({o.windows} windows) it predicts {fit:.4g} s/step, measured "
                f"{measured:.4g} ({fit / measured - 1:+.0%})")
        if x > 1:
            line += f" (x{x:.3g}: more ranks than cores)"
        before = self.predicted.get(st.spec.id)
        if before is not None and before[0] == key:
            del self.predicted[st.spec.id]
            line += (f"; predicted {before[1]:.4g} s/step before running it "
                     f"({before[1] / measured - 1:+.0%})")
        self._note(st, line)

    def _reap(self) -> int:
        self._observe()   # a job that ends now: what it measured last still counts
        ended = super()._reap()
        for jid, errs in list(self.held_out.items()):
            st = self.states[jid]
            if st.end >= 0 and errs:
                abs_errs = sorted(abs(e) for e in errs)
                self._note(st, f"phalanx: scheduler: {st.spec.name}: the fitted model against "
                               f"{len(errs)} later windows of set-ups it was fitted to: "
                               f"median |error| {statistics.median(abs_errs):.0%}, "
                               f"max {abs_errs[-1]:.0%}")
                del self.held_out[jid]
        return ended

    # ------------------------------------------------------------------ decisions
    def _round(self) -> None:
        """The core's elastic round over the resizable jobs, on the devices the others
        leave; its answer is applied by ``keep`` / ``vacate`` / ``move`` (a stop is
        asynchronous: a stopped job is resized to its target when its ranks are gone, and
        the fill pass starts the waiting jobs that are not benched)."""
        self._account()
        self._observe()
        live = {jid for jid, r in self.runs.items() if not r.stop}
        pinned = sum(r.state.spec.gpus for jid, r in self.runs.items()
                     if jid not in self.observers)
        views = [job_view(st, self.topology, self.policy, held=st.spec.id in live,
                          epoch=self.observers[st.spec.id].epoch, remaining=None,
                          # a parameter-server driver starts every worker on its first
                          # node (launch_plan.rank_slots): more workers than a node's
                          # devices would share them
                          limit=0 if self.plans[st.spec.id].per_rank else self.policy.node_gpus)
                 for st in self._elastic_states()]
        if not views:
            return
        self.benched = set()
        self.core.elastic_round(views, self.core.cluster.capacity - pinned, self.now, self)

    # the elastic round's answer, applied (``ElasticEngine``)
    def _stopping(self, st: JobState) -> bool:
        run = self.runs.get(st.spec.id)
        return run is not None and bool(run.stop)

    def keep(self, st: JobState, c: Choice) -> None:
        self.target[st.spec.id] = c.gpus
        if c.gpus == 0 and st.spec.id not in self.runs:
            self.benched.add(st.spec.id)

    def vacate(self, st: JobState) -> None:
        self.target[st.spec.id] = 0
        if not self._stopping(st):
            self._stop(self.runs[st.spec.id], "preempt")

    def move(self, st: JobState, c: Choice) -> None:
        # a job still stopping is resized to the target when its ranks are gone
        self.target[st.spec.id] = c.gpus
        run = self.runs.get(st.spec.id)
        if run is not None and not run.stop:
            self._stop(run, "preempt")
        elif run is None and c.gpus != st.spec.gpus:
            self._regang_waiting(st, c.gpus)

    def place(self, moves: Sequence[tuple[Choice, JobState]]) -> None:
        """Nothing here: the fill pass starts the moved jobs once their devices are free."""

    def _elastic_states(self) -> list[JobState]:
        running = [r.state for r in self.runs.values() if r.state.spec.id in self.observers]
        waiting = [st for st in self.core.waiting.values() if st.spec.id in self.observers]
        return running + waiting

    def _requeue(self, st: JobState, rc: int) -> None:
        n = self.target.get(st.spec.id, st.spec.gpus)
        if n and n != st.spec.gpus and self._resize(st, n):
            st.spec = dataclasses.replace(st.spec, gpus=n)
        self.core.enqueue(st)
        if not n:
            self.benched.add(st.spec.id)

    def _regang_waiting(self, st: JobState, n: int) -> None:
        """A waiting job gets another size: a job that ran has its folder resized first."""
        if st.preemptions == 0 or self._resize(st, n):
            self.core.regang(st, n)

    def _resize(self, st: JobState, n: int) -> bool:
        """Rewrite the stopped job's run folder for ``n`` workers (False: it cannot be)."""
        k = self.policy.learner.knowledge(st.spec.id, st.spec.application)
        nodes = -(-n // self.policy.node_gpus)
        batch = self.policy.learner.batch_config(st.spec.id, st.spec.application, nodes, n).atomic
        run_dir = self.config.out / "jobs" / st.spec.name
        if not resumable(self._by_id[st.spec.id], run_dir):
            return True      # nothing on disk yet: it starts anew at the new size
        try:
            old, new = resize_run(run_dir, n, int(batch))
        except ConfigError as e:
            # from now on it runs at its size: the policy would stop it again and again
            self._note(st, f"phalanx: scheduler: {st.spec.name}: not resized ({e}); it keeps "
                           f"{st.spec.gpus} worker(s) from now on")
            self.observers.pop(st.spec.id, None)
            self.why_fixed[st.spec.id] = str(e)
            return False
        if k.params is not None:
            self.predicted[st.spec.id] = ((n, nodes, int(batch)), k.predict(n, nodes, batch)
                                          * self._slowdown_at(st.spec.id, n))
        self.resizes.append((st.spec.name, self.now, st.spec.gpus, n))
        self._note(st, f"phalanx: scheduler: {st.spec.name}: resized {st.spec.gpus} -> {n} "
                       f"workers, batch {int(batch)} per worker, step {old} -> {new}")
        return True

    def _fill(self) -> None:
        waiting = [st for jid, st in self.core.waiting.items() if jid not in self.benched]
        if waiting:
            self.core.try_start(self.ordering.order(waiting, self.now), self._start)
