"""One entry for a simulation run (used by the CLI, the bench and the studies): options as a
dataclass in, a summary and the raw result out."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from phalanx.cluster.clusters import resolve_cluster
from phalanx.cluster.jobs import JobSpec
from phalanx.cluster.perf import PerfModel, PerfOptions
from phalanx.cluster.policies import (
    AcceptAll,
    AdmissionPolicy,
    OrderingPolicy,
    PlacementPolicy,
    make_ordering,
    make_placement,
    parse_quota,
)
from phalanx.cluster.policies.ordering import DEFAULT_SLOT_S
from phalanx.cluster.profiles import load_pollux_apps, load_profiles
from phalanx.cluster.report import Summary, summarise
from phalanx.cluster.simulator import SimConfig, SimResult, Simulator
from phalanx.cluster.topology import Topology
from phalanx.cluster.traces import Trace, TraceOptions, load_trace
from phalanx.errors import ConfigError


def default_data_dir() -> Path:
    """``../shared/data`` next to the repository root (where CI has it too)."""
    return (Path(__file__).resolve().parents[2] / ".." / "shared" / "data").resolve()


@dataclass(frozen=True)
class SimulateOptions:
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

    def __post_init__(self) -> None:
        # flags are checked here, before any file is read or any run starts
        if not 0.0 <= self.threshold <= 1.0:
            raise ConfigError(f"--threshold must be in [0, 1], got {self.threshold}")
        if self.hysteresis is not None and not 0.0 <= self.hysteresis <= self.threshold:
            raise ConfigError(f"--hysteresis must be in [0, threshold={self.threshold}], "
                              f"got {self.hysteresis}")
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

    def trace_options(self) -> TraceOptions:
        return TraceOptions(self.data_dir, seed=self.seed, skip_bad_rows=self.skip_bad_rows,
                            limit=self.limit, load_scale=self.load_scale)


@dataclass(frozen=True)
class Inputs:
    topology: Topology
    trace: Trace
    perf: PerfModel


def load_inputs(opts: SimulateOptions) -> Inputs:
    topology = resolve_cluster(opts.cluster, opts.data_dir)
    trace = load_trace(opts.trace, opts.trace_options(), topology)
    perf = PerfModel(load_profiles(opts.data_dir), load_pollux_apps(opts.data_dir),
                     perf_options(opts))
    return Inputs(topology, trace, perf)


def usable_gpus(topology: Topology) -> int:
    """The largest gang the cluster can ever run: each GPU needs one CPU core."""
    return sum(min(s.num_devices, s.cpu_cores) for s in topology.servers)


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


def simulate(opts: SimulateOptions, inputs: Inputs | None = None,
             jobs: tuple[JobSpec, ...] | None = None,
             placement: PlacementPolicy | None = None,
             ordering: OrderingPolicy | None = None) -> tuple[Summary, SimResult]:
    """Run one simulation; ``placement`` / ``ordering`` override ``opts.placement`` /
    ``opts.ordering`` with policy objects (studies and benches use variants that have no
    registry name)."""
    inputs = inputs or load_inputs(opts)
    admission: AdmissionPolicy = parse_quota(opts.quota) if opts.quota else AcceptAll()
    if placement is None:
        placement = make_placement(opts.placement, opts.threshold, opts.hysteresis)
    sim = Simulator(inputs.topology, jobs if jobs is not None else inputs.trace.jobs,
                    ordering or make_ordering(opts.ordering, opts.slot_s), placement,
                    inputs.perf, admission,
                    SimConfig(opts.checkpoint_cost_s, progress=opts.progress))
    res = sim.run()
    return summarise(res, opts.ordering, opts.placement, inputs.topology.name,
                     opts.trace), res


def with_policy(opts: SimulateOptions, ordering: str, placement: str) -> SimulateOptions:
    return replace(opts, ordering=ordering, placement=placement)
