"""``phalanx schedule --policy goodput|sia|pollux``: an elastic policy of the catalog
(``policies/catalog.py``, the simulator's) on live jobs, with elastic resize.

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
2. **Allocate.** The policy's ``allocate`` (the simulator's policy object; goodput:
   ``LearnedGoodputPolicy``, or the typed one on device types) gives each resizable job a
   GPU count (and a device type): under goodput a job never run gets one GPU, a job may
   grow to twice the most it has run on, a change must pay its restart back; sia solves
   its MILP over the types, pollux runs its genetic search.
3. **Resize.** A job whose count changes is stopped (SIGTERM: sync / average checkpoint at
   one step; a parameter-server job keeps its last periodic checkpoint), its run folder is
   rewritten for the new workers and the batch the model picks for them
   (:func:`~phalanx.entry.resize.resize_run`: the strategy's own hook), and it resumes from
   that checkpoint on the placement the placement policy finds.

What a job's application "declares" (Pollux's facts) comes from its job-list entry: the
initial batch is ``batch_size x gpus``; a worker's batch may range over
``[batch_size / 2, 2 x batch_size]``; the total batch up to ``2 x batch_size`` x the
cluster's devices. A parameter-server job is resized in its workers (its shards stay;
:mod:`~phalanx.parallel.ps_resize`). Jobs that cannot be resized (single, Hogwild!, the
stage strategies, SandBlaster, or a job that cannot be preempted) keep their declared
gang and run first come, first served on the devices the resizable jobs were not given
(on a typed cluster, the MILP's capacity per type excludes the devices they hold); the CLI
prints why each is not resizable.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from collections.abc import Sequence

from phalanx.cluster.core.cadence import Cadence
from phalanx.cluster.core.jobs import JobState
from phalanx.cluster.core.scheduler import placement_order
from phalanx.cluster.core.topology import Topology
from phalanx.cluster.core.view import Choice, ElasticPolicy, job_view
from phalanx.cluster.live.config import LiveConfig
from phalanx.cluster.live.engines.base import Executor
from phalanx.cluster.live.joblist import LiveJob
from phalanx.cluster.live.launch_plan import emulate_type, resumable
from phalanx.cluster.live.live_policies import describe, live_inputs
from phalanx.cluster.live.loop import LiveCluster
from phalanx.cluster.live.observe import WINDOWS, EventTail, JobObserver, Observation
from phalanx.cluster.live.state import SavedState
from phalanx.cluster.model.core_share import CoreShare
from phalanx.cluster.model.learned import Learner
from phalanx.cluster.policies import FIFO, PlacementPolicy
from phalanx.cluster.policies.catalog import ELASTIC
from phalanx.cluster.policies.goodput_typed import TypedOptions
from phalanx.cluster.policies.placement import place_typed
from phalanx.cluster.policies.typed_base import cluster_types
from phalanx.config import RunConfig
from phalanx.entry.resize import refusal, resize_run
from phalanx.errors import ConfigError
from phalanx.parallel.registry import spec
from phalanx.settings import parse_device


class ElasticLiveCluster(LiveCluster):
    """The live engine under the learned goodput policy: observes each job's steps and
    gradient noise, and applies the core's elastic round by stopping a job and resuming it
    from its checkpoint rewritten for its new size (its strategy's resize hook)."""

    def __init__(self, topology: Topology, jobs: Sequence[LiveJob],
                 placement: PlacementPolicy, config: LiveConfig, cadence: Cadence,
                 horizon_s: float = 1800.0, executor: Executor | None = None,
                 cores: CoreShare | None = None, resume: SavedState | None = None,
                 policy: str = "goodput", typed: TypedOptions | None = None) -> None:
        # ``resume``: what the policy learned is not saved; it observes the jobs anew
        super().__init__(topology, jobs, FIFO(), placement, config, executor=executor,
                         resume=resume)
        self.round_s = cadence.interval_s
        self.why_fixed = {j.spec.id: self._why_fixed(j) for j in self.jobs}
        elastic = [j for j in self.jobs if not self.why_fixed[j.spec.id]]
        for j in self.jobs:
            if j.profile and self.why_fixed[j.spec.id]:
                raise ConfigError(f"{j.spec.name}: profile: the policy does not schedule it "
                                  f"({self.why_fixed[j.spec.id]}: it runs at its own gang, "
                                  "first come, first served); drop the profile")
        # CPU jobs' ranks share their machines' cores (``cores``: None, never crowded)
        self.cores = cores
        self.on_cpu = {j.spec.id: parse_device(RunConfig.from_mapping(
            j.config, source=j.spec.name).device).kind == "cpu" for j in self.jobs}
        # the device types (one, untyped: its servers' size) and GPUs per node of each
        self.types = cluster_types([(s.device_type, s.num_devices)
                                    for s in topology.servers]) if topology.typed else ()
        # the catalog's policy, built from what this cluster knows (live_policies)
        self.policy: ElasticPolicy = ELASTIC.get(policy)(live_inputs(
            topology, elastic, cadence, horizon_s,
            slowdown=self._slowdown_at if cores is not None else None,
            typed_options=typed))
        self.core.elastic = self.policy
        self.target_type: dict[int, str] = {}   # the type the round chose ('' any)
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

    # ------------------------------------------------------------------ device types
    def _type_of(self, jid: int) -> str:
        """The device type job ``jid`` runs on now, or last ran on ('' untyped)."""
        st = self.states[jid]
        if not self.topology.typed or not st.placements:
            return ""
        return self.topology.gang_type(st.placements[-1][1])

    def _learner(self, jid: int, device_type: str | None = None) -> Learner:
        """The model of job ``jid``'s speed: on a typed cluster, the one fitted to what it
        ran on ``device_type`` (default: its type now)."""
        dtype = device_type or self._type_of(jid) or (
            self.types[0].name if self.types else self.topology.servers[0].device_type)
        learner = self.policy.learner_for(dtype)
        assert learner is not None     # both live policies learn (per type, or at all)
        return learner

    def _node_gpus(self, device_type: str = "") -> int:
        if self.types:
            return next((t.node_gpus for t in self.types if t.name == device_type),
                        min(t.node_gpus for t in self.types))
        return max(self.topology.server_size)

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
                                  self._node_gpus())

    # ------------------------------------------------------------------ observations
    def _observe(self) -> None:
        for jid, run in self.runs.items():
            obs = self.observers.get(jid)
            if obs is None:
                continue
            nodes = len({s.server for s in run.gang.ranks})
            # times are taken in per whole core (divided by the slowdown), predictions
            # times the slowdown where they apply
            dtype = self._type_of(jid)
            ready, fresh = obs.read(nodes, self._slowdown_now(jid), dtype)
            k = self._learner(jid, dtype).knowledge(jid, run.state.spec.application)
            for w in fresh:
                # a window measured after the model was fitted to its set-up: the fit's
                # prediction, held out in time, against what was measured
                g, n, b = w.key
                if w.index >= WINDOWS and k.params is not None and (n, g, float(b)) in k.profile:
                    self.held_out.setdefault(jid, []).append(k.predict(g, n, b) / w.step_s - 1)
            for o in ready:
                self._learn(run.state, obs, o, dtype)

    def _learn(self, st: JobState, obs: JobObserver, o: Observation, dtype: str) -> None:
        name = st.spec.name
        app = st.spec.application
        learner = self._learner(st.spec.id, dtype)
        facts = learner.facts[app]
        learner.observe(st.spec.id, app, o.gpus, o.nodes, o.batch, o.step_s,
                        o.sync_s, obs.grad(facts.init_batch), replace=True)
        k = learner.knowledge(st.spec.id, app)
        if dtype:
            name = f"{name} on {dtype}"
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
        leave; its ``Decision`` is applied here (a stop is asynchronous: a stopped job is
        resized to its target when its ranks are gone, and the fill pass starts the
        waiting jobs that are not benched)."""
        self._account()
        self._observe()
        live = {jid for jid, r in self.runs.items() if not r.stop}
        fixed = [r for jid, r in self.runs.items() if jid not in self.observers]
        pinned = sum(r.state.spec.gpus for r in fixed)
        # a policy that gives each type's GPUs: those the jobs it cannot resize hold are
        # not its to give
        held: Counter[str] = Counter()
        if self.types:
            for r in fixed:
                devices = r.state.placements[-1][1]
                held[self.topology.gang_type(devices)] += len(devices)
        views = [job_view(st, self.topology, self.policy, held=st.spec.id in live,
                          epoch=self.observers[st.spec.id].epoch, remaining=None,
                          # a parameter-server driver starts every worker on its first
                          # node (launch_plan.rank_slots): more workers than a node's
                          # devices would share them
                          limit=0 if self.plans[st.spec.id].per_rank
                          else self._node_gpus(self._type_of(st.spec.id)))
                 for st in self._elastic_states()]
        if not views:
            return
        self.benched = set()
        d = self.core.elastic_round(views, self.core.cluster.capacity - pinned, self.now,
                                    held=dict(held))
        for ch in d.changes:
            st, c = self.states[ch.job], ch.choice
            if ch.kind == "keep":
                self.target[ch.job] = c.gpus
                self.target_type[ch.job] = c.device_type
                if c.gpus == 0 and ch.job not in self.runs:
                    self.benched.add(ch.job)
            elif ch.kind == "vacate":
                self.target[ch.job] = 0
                if not self._stopping(st):
                    self._stop(self.runs[ch.job], "preempt")
            else:
                self._move(st, c)
        # the moved jobs are placed by the fill pass once their devices are free, in the
        # core's placement order (``_fill``)

    def _stopping(self, st: JobState) -> bool:
        run = self.runs.get(st.spec.id)
        return run is not None and bool(run.stop)

    def _move(self, st: JobState, c: Choice) -> None:
        # a job still stopping is resized to the target when its ranks are gone; on a
        # typed cluster it resumes on the type chosen (a change of type is a move)
        self.target[st.spec.id] = c.gpus
        self.target_type[st.spec.id] = c.device_type
        if (self.topology.typed and c.device_type and st.placements
                and c.device_type != self._type_of(st.spec.id)):
            self._note(st, f"phalanx: scheduler: {st.spec.name}: moves from "
                           f"{self._type_of(st.spec.id)} to {c.device_type} ({c.gpus} GPU)")
        run = self.runs.get(st.spec.id)
        if run is not None and not run.stop:
            self._stop(run, "preempt")
        elif run is None and c.gpus != st.spec.gpus:
            self._regang_waiting(st, c.gpus)

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
        dtype = self.target_type.get(st.spec.id) or self._type_of(st.spec.id)
        learner = self._learner(st.spec.id, dtype)
        k = learner.knowledge(st.spec.id, st.spec.application)
        nodes = -(-n // self._node_gpus(dtype))
        batch = learner.batch_config(st.spec.id, st.spec.application, nodes, n).atomic
        run_dir = self.config.out / "jobs" / st.spec.name
        if not resumable(self._by_id[st.spec.id], run_dir):
            return True      # nothing on disk yet: it starts anew at the new size
        # the emulated slowdown names the old ranks: the next start sets it for the new
        if self.topology.emulated:
            emulate_type(run_dir, 1.0)
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
        if not waiting:
            return
        # the policy's jobs in the order the simulator places a round's moves (biggest
        # first: core.placement_order), then the jobs it cannot resize, first come first
        # served
        managed = [st for st in waiting if st.spec.id in self.observers]
        order = [st.spec.id for st in placement_order([(st.spec.gpus, st) for st in managed])]
        order += self.ordering.order([st for st in waiting if st.spec.id not in self.observers],
                                     self.now)
        # a job the round gave a device type starts on that type only
        for jid in order:
            t = self.target_type.get(jid)
            st = self.core.waiting.get(jid)
            if t and st is not None:
                p = place_typed(self.core.cluster, st.spec, st.spec.gpus, t)
                if p is not None:
                    self._start(st, p)
        rest = [jid for jid in order if not self.target_type.get(jid)]
        if rest:
            self.core.try_start(rest, self._start)
