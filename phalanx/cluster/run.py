"""One entry for a simulation run (used by the CLI, the bench and the studies): options as a
dataclass in, a summary and the raw result out."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from phalanx.cluster.clusters import resolve_cluster
from phalanx.cluster.jobs import JobSpec
from phalanx.cluster.perf import PerfModel, PerfOptions
from phalanx.cluster.policies import (
    AcceptAll,
    AdmissionPolicy,
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
    data_dir: Path = field(default_factory=default_data_dir)
    seed: int = 0
    limit: int = 0
    load_scale: float = 1.0
    skip_bad_rows: bool = False
    progress: bool = False

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
                     PerfOptions(interference=opts.interference))
    return Inputs(topology, trace, perf)


def simulate(opts: SimulateOptions, inputs: Inputs | None = None,
             jobs: tuple[JobSpec, ...] | None = None) -> tuple[Summary, SimResult]:
    inputs = inputs or load_inputs(opts)
    admission: AdmissionPolicy = parse_quota(opts.quota) if opts.quota else AcceptAll()
    sim = Simulator(inputs.topology, jobs if jobs is not None else inputs.trace.jobs,
                    make_ordering(opts.ordering, opts.slot_s),
                    make_placement(opts.placement, opts.threshold), inputs.perf, admission,
                    SimConfig(opts.checkpoint_cost_s, progress=opts.progress))
    res = sim.run()
    return summarise(res, opts.ordering, opts.placement, inputs.topology.name,
                     opts.trace), res


def with_policy(opts: SimulateOptions, ordering: str, placement: str) -> SimulateOptions:
    return replace(opts, ordering=ordering, placement=placement)
