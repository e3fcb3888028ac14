"""One entry for a simulation run (used by the CLI, the bench and the studies): options as a
dataclass in, a summary and the raw result out."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from phalanx.cluster.core.cadence import Cadence
from phalanx.cluster.core.clusters import default_data_dir, resolve_cluster
from phalanx.cluster.core.jobs import JobSpec
from phalanx.cluster.core.report import Summary, summarise
from phalanx.cluster.core.result import SimResult
from phalanx.cluster.core.scheduler import usable_gpus
from phalanx.cluster.core.topology import Topology
from phalanx.cluster.core.view import ElasticPolicy
from phalanx.cluster.model.perf import PerfModel, PerfOptions
from phalanx.cluster.model.profiles import (
    SIA_PROFILED_TYPES,
    SIA_REFERENCE_TYPE,
    load_pollux_apps,
    load_profiles,
    load_sia_apps,
)
from phalanx.cluster.policies import (
    AcceptAll,
    AdmissionPolicy,
    OrderingPolicy,
    PlacementPolicy,
    make_ordering,
    make_placement,
    parse_quota,
)
from phalanx.cluster.policies.catalog import ELASTIC, ElasticInputs
from phalanx.cluster.policies.goodput import GoodputOptions
from phalanx.cluster.policies.goodput_learned import LearnedOptions
from phalanx.cluster.policies.goodput_typed import TypedOptions
from phalanx.cluster.policies.ordering import DEFAULT_SLOT_S, check_thresholds
from phalanx.cluster.policies.placement import PlacementOptions
from phalanx.cluster.policies.pollux import PolluxOptions
from phalanx.cluster.sim.event import SimConfig, Simulator
from phalanx.cluster.sim.interval import IntervalConfig, IntervalSimulator
from phalanx.cluster.sim.traces import Trace, TraceOptions, load_trace
from phalanx.errors import ConfigError


@dataclass(frozen=True)
class SimulateOptions:
    """Everything a simulation run is given (the CLI's flags, the studies' grids); each
    section of it is checked once, by the class that owns it."""

    trace: str = "philly"
    cluster: str = "philly-2048"
    ordering: str = "fifo"
    placement: str = "topology"
    threshold: float = 0.5
    slot_s: float = DEFAULT_SLOT_S
    checkpoint_cost_s: float = 60.0
    quota: str = ""
    interference: bool = True
    interference_scale: float = 1.0   # multiplies the neighbour weights (0.3 switch, 0.1 server)
    hysteresis: float | None = None   # load-adaptive: None = the policy's default
    data_dir: Path = field(default_factory=default_data_dir)
    seed: int = 0
    limit: int = 0
    load_scale: float = 1.0
    skip_bad_rows: bool = False
    progress: bool = False
    # interval engine (interval_s set, or the goodput policy): see interval.py
    interval_s: float | None = None
    restart_cost_s: float = 30.0
    restart_first: bool = True
    tiresias_thresholds: tuple[float, ...] | None = None   # None: Tiresias's defaults
    starvation: float | None = None
    goodput_priority: str = "none"      # srpt reads remaining work (declared epochs)
    goodput_horizon_s: float = 1800.0
    goodput_batch: str = "adaptive"     # or "fixed": each job keeps its own batch (ablation)
    # what an elastic policy knows of throughput: "learned" (fitted to the set-ups each
    # job has run, as Pollux) or "oracle" (every measured profile: an ablation)
    profiles: str = "learned"
    pollux_generations: int = 30
    pollux_search: str = "ga"           # or "greedy" (the same objective, no GA)
    # learned goodput ablations (policies/goodput_learned.py): bonus for GPU counts a job
    # has not run, one model per application over all its jobs, a change's minimum gain
    goodput_explore: float = 0.0
    goodput_share: bool = False
    goodput_min_gain: float = 0.1
    goodput_speedup_units: bool = False
    goodput_growth: float = 2.0
    goodput_multistart: bool = False
    # --policy goodput on several GPU types (policies/goodput_typed.py)
    typed_p: float = -0.25          # the power mean's p (Sia's: -0.5; our sia keeps it)
    typed_growth: float = 8.0       # a job grows to this x the most GPUs it ran (Sia: 2)
    typed_start: int = 4            # GPUs of one node a job may start on, nothing fitted
    typed_min_gain: float = 0.2     # a change must beat the kept configuration by this
    typed_lambda_n: float = 1.1
    typed_batch: str = "job"
    typed_restart: str = "horizon"
    typed_weight: str = "none"
    typed_share: bool = False       # per-application priors: an ablation (more than Sia sees)
    # what the typed policy knows of throughput: "equal" (Sia's information); the
    # ablations "offline-fit" / "oracle" read every measured profile (never a headline)
    typed_knowledge: str = "equal"
    typed_known_cap: str = "profile"    # with those: "own" keeps equal information's cap
    preset: str = ""

    def __post_init__(self) -> None:
        # flags are checked here, before any file is read or any run starts
        # (each section checks its own flags, once)
        self.cadence()
        if self.tiresias_thresholds is not None:
            check_thresholds(self.tiresias_thresholds)
        if self.starvation is not None and not 0.0 <= self.starvation < math.inf:
            raise ConfigError(f"--starvation must be a finite number >= 0 (0 = off), "
                              f"got {self.starvation}")
        self.goodput()
        self.learned()
        self.typed()
        self.pollux()
        self.placing()
        if not 0.0 <= self.interference_scale < math.inf:
            raise ConfigError(f"--interference-scale must be a finite number >= 0, "
                              f"got {self.interference_scale}")
        # a slot under a second makes millions of rounds (and under ~1e-12 s of a trace's
        # clock, time stops advancing): the simulation would never end
        if not 1.0 <= self.slot_s < math.inf:
            raise ConfigError(f"--slot must be a finite number > 0 seconds, at least 1, "
                              f"got {self.slot_s}")
        if not 0.0 <= self.checkpoint_cost_s < math.inf:
            raise ConfigError(f"--checkpoint-cost must be a finite number >= 0, "
                              f"got {self.checkpoint_cost_s}")

    # the sections, each owned (and checked) by its engine or policy
    def goodput(self) -> GoodputOptions:
        return GoodputOptions(priority=self.goodput_priority, horizon_s=self.goodput_horizon_s,
                              batch=self.goodput_batch, profiles=self.profiles)

    def learned(self) -> LearnedOptions:
        return LearnedOptions(self.goodput_explore, self.goodput_share, self.goodput_min_gain,
                              self.goodput_speedup_units, self.goodput_growth,
                              self.goodput_multistart)

    def typed(self) -> TypedOptions:
        return TypedOptions(p=self.typed_p, lambda_n=self.typed_lambda_n,
                            batch=self.typed_batch, restart=self.typed_restart,
                            horizon_s=self.goodput_horizon_s,
                            min_gain=self.typed_min_gain, weight=self.typed_weight,
                            share=self.typed_share, growth=self.typed_growth,
                            start=self.typed_start,
                            knowledge=self.typed_knowledge,
                            known_cap=self.typed_known_cap)

    def pollux(self) -> PolluxOptions:
        return PolluxOptions(generations=self.pollux_generations, search=self.pollux_search)

    def placing(self) -> PlacementOptions:
        return PlacementOptions(threshold=self.threshold, hysteresis=self.hysteresis)

    def cadence(self) -> Cadence:
        """The interval engine's cadence (60 s when only an elastic policy asks for it)."""
        return Cadence(60.0 if self.interval_s is None else self.interval_s,
                       self.restart_cost_s, self.restart_first)

    def trace_options(self) -> TraceOptions:
        return TraceOptions(self.data_dir, seed=self.seed, skip_bad_rows=self.skip_bad_rows,
                            limit=self.limit, load_scale=self.load_scale)


@dataclass(frozen=True)
class Inputs:
    """What a run reads once and several runs share: the topology, the trace, the perf
    model."""

    topology: Topology
    trace: Trace
    perf: PerfModel


def load_inputs(opts: SimulateOptions) -> Inputs:
    topology = resolve_cluster(opts.cluster, opts.data_dir)
    trace = load_trace(opts.trace, opts.trace_options(), topology)
    types = sorted({s.device_type for s in topology.servers})
    if all(t in SIA_PROFILED_TYPES for t in types):
        # every GPU type has Sia's per-type profiles: each job runs at its type's speed
        typed = load_sia_apps(opts.data_dir, types)
        perf = PerfModel(load_profiles(opts.data_dir), typed[SIA_REFERENCE_TYPE]
                         if SIA_REFERENCE_TYPE in typed else typed[types[0]],
                         perf_options(opts), typed)
    else:
        perf = PerfModel(load_profiles(opts.data_dir), load_pollux_apps(opts.data_dir),
                         perf_options(opts))
    return Inputs(topology, trace, perf)


# The Pollux artifact's conditions (petuum/adaptdl osdi21-artifact simulator): 60 s
# scheduling interval with arrivals and completions seen at its boundaries, 30 s restart
# on every allocation including the first, Tiresias with 2 queues split at 57,600 GPU-s
# (16 GPU-hours) and no starvation guard, placement by GPU count (most free node first),
# no interference. Explicit flags override each field.
PRESETS: dict[str, dict[str, object]] = {
    "pollux-artifact": {"interval_s": 60.0, "restart_cost_s": 30.0, "restart_first": True,
                        "tiresias_thresholds": (57600.0,), "starvation": 0.0,
                        "placement": "count", "interference": False,
                        "cluster": "pollux-64"},
    # Sia's simulator (siasosp23/artifacts sia-simulator): 60 s rounds (Gavel: 360 s, set
    # per run), every allocation restarts the job for its application's checkpoint-
    # restore time (Sia's per-application figures), no interference, its 64-GPU cluster
    "sia-artifact": {"interval_s": 60.0, "restart_first": True, "interference": False,
                     "placement": "count", "cluster": "sia-64"},
}


def apply_preset(name: str, given: dict[str, object]) -> dict[str, object]:
    """Fields of the preset ``name`` that ``given`` (the options set explicitly) leaves
    open, merged with ``given``."""
    if not name:
        return dict(given)
    if name not in PRESETS:
        raise ConfigError(f"--preset {name}: unknown (choose from {', '.join(PRESETS)})")
    out = dict(PRESETS[name])
    if name == "sia-artifact" and given.get("ordering") == "gavel":
        out["interval_s"] = 360.0     # Sia ran Gavel with 360 s rounds
    out.update(given)
    out["preset"] = name
    return out


def check_fits(inputs: Inputs) -> int:
    """How many jobs can never run on the cluster (they are rejected with their reason);
    raises when none can, since the whole trace is then unusable."""
    usable = usable_gpus(inputs.topology)
    jobs = inputs.trace.jobs
    too_big = sum(1 for j in jobs if j.gpus > usable)
    if too_big == len(jobs):
        smallest = min(j.gpus for j in jobs)
        raise ConfigError(f"trace {inputs.trace.source}: none of its {len(jobs)} jobs fits "
                          f"cluster {inputs.topology.name} (smallest gang {smallest} GPUs, "
                          f"cluster has {inputs.topology.num_devices}, {usable} usable)")
    return too_big


def perf_options(opts: SimulateOptions) -> PerfOptions:
    base = PerfOptions()
    return PerfOptions(interference=opts.interference,
                       k_switch=base.k_switch * opts.interference_scale,
                       k_server=base.k_server * opts.interference_scale)


def elastic_inputs(opts: SimulateOptions, inputs: Inputs) -> ElasticInputs:
    """What the catalog's elastic policies are built from in simulation: the measured
    profiles (per type where the cluster's types have them), the run's sections."""
    servers = inputs.topology.servers
    typed = inputs.perf.typed
    return ElasticInputs(
        cluster=inputs.topology.name, server_sizes=tuple(s.num_devices for s in servers),
        server_types=tuple(s.device_type for s in servers),
        server_ids=tuple(s.index for s in servers), apps=inputs.perf.pollux, typed=typed,
        restart_s=opts.restart_cost_s,
        restart_by_app={a: float(x.restart_s) for apps in typed.values()
                        for a, x in apps.items() if x.restart_s is not None},
        seed=opts.seed, interval_s=opts.interval_s, goodput=opts.goodput(),
        learned=opts.learned(), typed_options=opts.typed(), pollux=opts.pollux())


def make_elastic(opts: SimulateOptions, inputs: Inputs) -> ElasticPolicy:
    """The elastic policy of ``opts.ordering`` (the catalog's) with what ``opts.profiles``
    lets it know."""
    return ELASTIC.get(opts.ordering)(elastic_inputs(opts, inputs))


def simulate(opts: SimulateOptions, inputs: Inputs | None = None,
             jobs: tuple[JobSpec, ...] | None = None,
             placement: PlacementPolicy | None = None,
             ordering: OrderingPolicy | None = None,
             elastic: ElasticPolicy | None = None) -> tuple[Summary, SimResult]:
    """Run one simulation; ``placement`` / ``ordering`` override ``opts.placement`` /
    ``opts.ordering`` with policy objects (studies and benches use variants that have no
    registry name); ``elastic``, the elastic policy object of ``opts.ordering`` (to read
    its state after the run)."""
    inputs = inputs or load_inputs(opts)
    admission: AdmissionPolicy = parse_quota(opts.quota) if opts.quota else AcceptAll()
    if placement is None:
        placement = make_placement(opts.placement, opts.threshold, opts.hysteresis)
    specs = jobs if jobs is not None else inputs.trace.jobs
    is_elastic = opts.ordering in ELASTIC
    if opts.interval_s is not None or is_elastic:
        interval = opts.interval_s if opts.interval_s is not None else 60.0
        if ordering is None:
            ordering = make_ordering("fifo" if is_elastic else opts.ordering, interval,
                                     opts.tiresias_thresholds, opts.starvation)
        goodput = (elastic or make_elastic(opts, inputs)) if is_elastic else None
        res = IntervalSimulator(inputs.topology, specs, ordering, placement, inputs.perf,
                                admission, IntervalConfig(interval, opts.restart_cost_s,
                                                          opts.restart_first, opts.progress),
                                goodput).run()
    else:
        sim = Simulator(inputs.topology, specs,
                        ordering or make_ordering(opts.ordering, opts.slot_s,
                                                  opts.tiresias_thresholds, opts.starvation),
                        placement, inputs.perf, admission,
                        SimConfig(opts.checkpoint_cost_s, progress=opts.progress))
        res = sim.run()
    # the elastic policy places its own jobs (pack, biggest first)
    summary = summarise(res, opts.ordering, _elastic_label(opts) if is_elastic else opts.placement,
                        inputs.topology.name, opts.trace)
    return replace(summary, skipped_rows=inputs.trace.skipped), res


def _elastic_label(opts: SimulateOptions) -> str:
    """The placement column of an elastic run: what it knew (oracle runs are ablations)."""
    if opts.ordering in ("pollux", "sia", "gavel"):
        return "learned" if opts.ordering != "gavel" else "measured"
    label = f"{opts.profiles}/{opts.goodput_priority}"
    return label + (" (oracle ablation)" if opts.profiles == "oracle" else "")


def with_policy(opts: SimulateOptions, ordering: str, placement: str) -> SimulateOptions:
    return replace(opts, ordering=ordering, placement=placement)
