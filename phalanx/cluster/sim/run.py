"""One entry for a simulation run (used by the CLI, the bench and the studies): options as a
dataclass in, a summary and the raw result out."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from phalanx.cluster.core.cadence import Cadence
from phalanx.cluster.core.clusters import default_data_dir, resolve_cluster
from phalanx.cluster.core.jobs import JobSpec
from phalanx.cluster.core.report import Summary, summarise
from phalanx.cluster.core.result import SimResult
from phalanx.cluster.core.scheduler import usable_gpus
from phalanx.cluster.core.topology import Topology
from phalanx.cluster.core.view import ElasticPolicy
from phalanx.cluster.model.families import load_profiles
from phalanx.cluster.model.interference import co_location
from phalanx.cluster.model.perf import PerfModel, PerfOptions
from phalanx.cluster.model.profiles import load_pollux_apps
from phalanx.cluster.model.sia_apps import SIA_PROFILED_TYPES, SIA_REFERENCE_TYPE, load_sia_apps
from phalanx.cluster.policies import (
    PLACEMENTS,
    AcceptAll,
    AdmissionPolicy,
    OrderingPolicy,
    PlacementPolicy,
    make_ordering,
    parse_quota,
)
from phalanx.cluster.policies.catalog import ELASTIC, ElasticInputs
from phalanx.cluster.policies.goodput import GoodputOptions
from phalanx.cluster.policies.goodput_typed import TypedOptions
from phalanx.cluster.policies.ordering import DEFAULT_SLOT_S, check_thresholds
from phalanx.cluster.policies.placement_catalog import PlacementOptions
from phalanx.cluster.policies.pollux import PolluxOptions
from phalanx.cluster.sim.event import SimConfig, Simulator
from phalanx.cluster.sim.interval import IntervalConfig, IntervalSimulator
from phalanx.cluster.sim.traces import Trace, TraceOptions, load_trace
from phalanx.errors import ConfigError

# each section's default, checked once when this module loads (a frozen default shared by
# every SimulateOptions that leaves the section alone)
_PLACING, _PERF, _GOODPUT = PlacementOptions(), PerfOptions(), GoodputOptions()
_TYPED, _POLLUX = TypedOptions(), PolluxOptions()

# the sections of SimulateOptions: key -> the class that owns (and checks) it
SECTIONS: dict[str, type] = {"placing": PlacementOptions, "perf": PerfOptions,
                             "goodput": GoodputOptions,
                             "typed": TypedOptions, "pollux": PolluxOptions}


@dataclass(frozen=True, kw_only=True)
class SimulateOptions:
    """Everything a simulation run is given (the CLI's flags, the studies' grids): the run's
    own fields, then one section per policy or model that reads them (torchtitan's
    ``JobConfig`` shape), each a frozen dataclass that checks itself once, where it is
    owned. A section left at its default is the module's validated default instance;
    :meth:`from_dict` builds one from nested dicts and refuses an unknown key."""

    trace: str = "philly"
    cluster: str = "philly-2048"
    ordering: str = "fifo"
    placement: str = "topology"
    slot_s: float = DEFAULT_SLOT_S
    checkpoint_cost_s: float = 60.0
    quota: str = ""
    data_dir: Path = field(default_factory=default_data_dir)
    seed: int = 0
    limit: int = 0
    load_scale: float = 1.0
    skip_bad_rows: bool = False
    progress: bool = False
    # interval engine (interval_s set, or an elastic policy): see interval.py
    interval_s: float | None = None
    restart_cost_s: float = 30.0
    restart_first: bool = True
    tiresias_thresholds: tuple[float, ...] | None = None   # None: Tiresias's defaults
    starvation: float | None = None
    preset: str = ""
    # sections (module-level defaults: frozen, checked when this module loads)
    placing: PlacementOptions = _PLACING       # --threshold, --hysteresis
    perf: PerfOptions = _PERF                  # --no-interference, --interference-scale
    goodput: GoodputOptions = _GOODPUT         # --goodput-*, --profiles (every goodput)
    typed: TypedOptions = _TYPED               # the learned goodput policy's switches
    pollux: PolluxOptions = _POLLUX            # --pollux-*

    def __post_init__(self) -> None:
        # the run's own flags are checked here, before any file is read or any run starts
        # (each section checked itself when it was made)
        for key, cls in SECTIONS.items():
            if not isinstance(getattr(self, key), cls):
                raise ConfigError(f"options: section {key} must be a {cls.__name__}, got "
                                  f"{type(getattr(self, key)).__name__}")
        Cadence(60.0 if self.interval_s is None else self.interval_s, self.restart_cost_s,
                self.restart_first)
        if self.tiresias_thresholds is not None:
            check_thresholds(self.tiresias_thresholds)
        if self.starvation is not None and not 0.0 <= self.starvation < math.inf:
            raise ConfigError(f"--starvation must be a finite number >= 0 (0 = off), "
                              f"got {self.starvation}")
        # a slot under a second makes millions of rounds (and under ~1e-12 s of a trace's
        # clock, time stops advancing): the simulation would never end
        if not 1.0 <= self.slot_s < math.inf:
            raise ConfigError(f"--slot must be a finite number > 0 seconds, at least 1, "
                              f"got {self.slot_s}")
        if not 0.0 <= self.checkpoint_cost_s < math.inf:
            raise ConfigError(f"--checkpoint-cost must be a finite number >= 0, "
                              f"got {self.checkpoint_cost_s}")

    @classmethod
    def from_dict(cls, given: Mapping[str, object]) -> SimulateOptions:
        """Options from a dict (a preset merged with a study's or the CLI's choices): a
        section's key holds a dict of its fields (or the section itself); an unknown key at
        either level is a one-line error naming it."""
        return cls(**_known(given, cls, "options", _section))

    def merged(self, changes: Mapping[str, object]) -> SimulateOptions:
        """These options with ``changes`` (nested as :meth:`from_dict`'s: a section's dict
        changes only the fields it names); an unknown key is an error."""
        out = {}
        for k, v in _known(changes, type(self), "options").items():
            cls = SECTIONS.get(k)
            out[k] = (replace(getattr(self, k), **_known(v, cls, f"options.{k}"))
                      if cls is not None and isinstance(v, Mapping) else v)
        return replace(self, **out)


def _known(given: Mapping[str, object], cls: type, where: str,
           convert: Callable[[str, object], object] = lambda k, v: v) -> dict[str, object]:
    """``given`` checked against ``cls``'s fields (an unknown key: one line naming it)."""
    names = [f.name for f in fields(cls)]
    out = {}
    for k, v in given.items():
        if k not in names:
            raise ConfigError(f"{where}: unknown key {k!r} (choose from {', '.join(names)})")
        out[k] = convert(k, v)
    return out


def _section(key: str, value: object) -> object:
    """A section's dict made into its class (which checks it); anything else as given."""
    cls = SECTIONS.get(key)
    if cls is None or not isinstance(value, Mapping):
        return value
    return cls(**_known(value, cls, f"options.{key}"))


@dataclass(frozen=True)
class Inputs:
    """What a run reads once and several runs share: the topology, the trace, the perf
    model."""

    topology: Topology
    trace: Trace
    perf: PerfModel


def load_inputs(opts: SimulateOptions) -> Inputs:
    topology = resolve_cluster(opts.cluster, opts.data_dir)
    trace = load_trace(opts.trace, TraceOptions(
        opts.data_dir, seed=opts.seed, skip_bad_rows=opts.skip_bad_rows, limit=opts.limit,
        load_scale=opts.load_scale), topology)
    # (loaded also under --no-interference: --placement interference still weighs it)
    co = co_location(opts.perf.pairs, opts.data_dir, opts.perf.k_switch, opts.perf.k_server)
    types = sorted({s.device_type for s in topology.servers})
    if all(t in SIA_PROFILED_TYPES for t in types):
        # every GPU type has Sia's per-type profiles: each job runs at its type's speed
        typed = load_sia_apps(opts.data_dir, types)
        perf = PerfModel(load_profiles(opts.data_dir), typed[SIA_REFERENCE_TYPE]
                         if SIA_REFERENCE_TYPE in typed else typed[types[0]],
                         opts.perf, typed, co)
    else:
        perf = PerfModel(load_profiles(opts.data_dir), load_pollux_apps(opts.data_dir),
                         opts.perf, co=co)
    return Inputs(topology, trace, perf)


# The Pollux artifact's conditions (petuum/adaptdl osdi21-artifact simulator): 60 s
# scheduling interval with arrivals and completions seen at its boundaries, 30 s restart
# on every allocation including the first, Tiresias with 2 queues split at 57,600 GPU-s
# (16 GPU-hours) and no starvation guard, placement by GPU count (most free node first),
# no interference. Explicit flags override each field.
PRESETS: dict[str, dict[str, object]] = {
    "pollux-artifact": {"interval_s": 60.0, "restart_cost_s": 30.0, "restart_first": True,
                        "tiresias_thresholds": (57600.0,), "starvation": 0.0,
                        "placement": "count", "perf": {"interference": False},
                        "cluster": "pollux-64"},
    # Sia's simulator (siasosp23/artifacts sia-simulator): 60 s rounds (Gavel: 360 s, set
    # per run), every allocation restarts the job for its application's checkpoint-
    # restore time (Sia's per-application figures), no interference, its 64-GPU cluster
    "sia-artifact": {"interval_s": 60.0, "restart_first": True,
                     "perf": {"interference": False}, "placement": "count",
                     "cluster": "sia-64"},
}


def apply_preset(name: str, given: dict[str, object]) -> dict[str, object]:
    """Fields of the preset ``name`` that ``given`` (the options set explicitly) leaves
    open, merged with ``given``."""
    if not name:
        return dict(given)
    if name not in PRESETS:
        raise ConfigError(f"--preset {name}: unknown (choose from {', '.join(PRESETS)})")
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in PRESETS[name].items()}
    if name == "sia-artifact" and given.get("ordering") == "gavel":
        out["interval_s"] = 360.0     # Sia ran Gavel with 360 s rounds
    for k, v in given.items():
        # a section given as a dict merges field by field with the preset's
        mine = out.get(k)
        out[k] = {**mine, **v} if isinstance(mine, dict) and isinstance(v, Mapping) else v
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


def scaled_interference(scale: float, interference: bool = True) -> PerfOptions:
    """The perf section of ``--interference-scale``: the neighbour weights (0.3 same PCIe
    switch, 0.1 same server) multiplied by ``scale``."""
    if not 0.0 <= scale < math.inf:
        raise ConfigError(f"--interference-scale must be a finite number >= 0, got {scale}")
    base = _PERF
    return PerfOptions(interference=interference, k_switch=base.k_switch * scale,
                       k_server=base.k_server * scale, pairs=base.pairs)


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
        seed=opts.seed, interval_s=opts.interval_s, goodput=opts.goodput,
        typed_options=opts.typed, pollux=opts.pollux)


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
        placement = PLACEMENTS.get(opts.placement)(replace(opts.placing, co=inputs.perf.co))
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
    label = (_elastic_label(opts.ordering, opts.goodput.profiles, opts.goodput.priority)
             if is_elastic else opts.placement)
    summary = summarise(res, opts.ordering, label,
                        inputs.topology.name, opts.trace)
    return replace(summary, skipped_rows=inputs.trace.skipped), res


def _elastic_label(ordering: str, profiles: str, priority: str) -> str:
    """The placement column of an elastic run: what it knew (oracle runs are ablations)."""
    if ordering in ("pollux", "sia", "gavel"):
        return "learned" if ordering != "gavel" else "measured"
    label = f"{profiles}/{priority}"
    return label + (" (oracle ablation)" if profiles == "oracle" else "")


def with_policy(opts: SimulateOptions, ordering: str, placement: str) -> SimulateOptions:
    return replace(opts, ordering=ordering, placement=placement)
