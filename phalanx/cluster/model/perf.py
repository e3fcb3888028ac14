"""Performance model: how fast a job progresses under an allocation.

``rate = locality x device x cpu x interference`` in the job's work units per second.

* locality — Pollux jobs (work = steps): ``1 / step_time`` looked up in the measured
  ``placements.csv`` / ``scalability.csv`` of the application at the job's batch size
  (gradient accumulation beyond the per-GPU batch limit). Other jobs (work = seconds on the
  ideal placement): ``m_ideal / m(shape)`` with
  ``m = 1 + a * [(1 - 1/servers) * (1 + 0.25*[racks>1] + 0.5*[zones>1]) + 0.1*extra_switches/gpus]``
  where ``a`` is the model's fitted spread penalty (profiles.py). The rack/zone/switch
  multipliers are assumptions (no measured data crosses racks or PCIe switches).
* device — the slowest device of the gang gates synchronous training: min over its
  devices of the model's measured speed on that type (Gavel), else the type's ``speed``.
* cpu — ``min(1, cores_given / cores_wanted) ** cpu_sensitivity`` (worst server).
* interference — PCIe neighbours: on each server of the job,
  ``1 / (1 + s * (k_switch * others_on_my_switches / my_switch_capacity
  + k_server * others_elsewhere_on_server / server_capacity))`` with ``s`` the model's
  Gavel-fitted sensitivity (measured for two jobs on ONE GPU); ``k_switch`` = 0.3 and
  ``k_server`` = 0.1 scale that down to neighbours sharing a PCIe switch / a server: an
  assumption, as no data set here measures neighbour interference. Worst server wins.
  With ``pairs`` set (``--interference-pairs gavel|FILE``) each neighbour is priced by
  its own pair instead of the job's one sensitivity (model/interference.py,
  ``CoLocation``): Gavel's pairs keep the two weights; a table measured here
  (``phalanx interference profile``: levels ``core`` and ``server``) needs none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from phalanx.cluster.core.jobs import JobSpec
from phalanx.cluster.core.topology import Topology
from phalanx.cluster.model.families import ModelProfile
from phalanx.cluster.model.interference import CoLocation
from phalanx.cluster.model.profiles import PolluxApplication
from phalanx.errors import ConfigError


@dataclass(frozen=True)
class Shape:
    """What the perf model needs to know about an allocation."""

    server_counts: tuple[int, ...]     # GPUs on each server used, in server order
    extra_switches: int                # PCIe switches used beyond one per server
    racks: int
    zones: int
    device_speed_min: float            # for this job's model
    cpu_share: float                   # min over servers of cores given / cores wanted


@dataclass(frozen=True)
class PerfOptions:
    """The perf model's switches: interference and its weights, shared cores."""

    interference: bool = True
    cpu: bool = True
    k_switch: float = 0.3
    k_server: float = 0.1
    # every device's job shares this many CPU cores machine-wide (a one-machine test
    # cluster whose devices are slots): n busy devices run at min(1, cores / n); 0 = off
    shared_cores: int = 0
    # pairwise interference (--interference-pairs): '' = the family sensitivities above,
    # 'gavel' = Gavel's measured pairs, else an interference.json (model/interference.py)
    pairs: str = ""

    def __post_init__(self) -> None:
        if not (0 <= self.k_switch < math.inf and 0 <= self.k_server < math.inf):
            raise ConfigError(f"perf model: interference weights must be finite numbers "
                              f">= 0, got {self.k_switch}, {self.k_server}")
        if self.shared_cores < 0:
            raise ConfigError("perf model: shared_cores must be >= 0")


def ideal_shape(gpus: int, topology: Topology) -> tuple[tuple[int, ...], int, int, int]:
    """The tightest possible placement of ``gpus`` on this topology's largest server."""
    s = max(topology.servers, key=lambda x: x.num_devices)
    per = s.num_devices
    counts = tuple([per] * (gpus // per) + ([gpus % per] if gpus % per else []))
    sw = max(s.switch_sizes)
    extra = sum(max(0, math.ceil(c / sw) - 1) for c in counts)
    rack_servers = max(len(r.servers) for r in topology.racks)
    racks = math.ceil(len(counts) / rack_servers)
    zone_racks = max(len(z.racks) for z in topology.zones)
    return counts, extra, racks, math.ceil(racks / zone_racks)


class PerfModel:
    """A job's rate under an allocation: locality (measured profiles), device type, CPU
    share and interference."""

    def __init__(self, profiles: Mapping[str, ModelProfile],
                 pollux: Mapping[str, PolluxApplication] | None = None,
                 options: PerfOptions = PerfOptions(),
                 typed: Mapping[str, Mapping[str, PolluxApplication]] | None = None,
                 co: CoLocation | None = None) -> None:
        self.profiles = dict(profiles)
        # pairwise interference (options.pairs loaded): replaces the family sensitivity
        self.co = co
        self.pollux = dict(pollux or {})
        self.options = options
        # per GPU type, each application's own profile (Sia's data): a step-based job
        # runs at its type's measured speed; empty = one profile for every type
        self.typed = {t: dict(a) for t, a in (typed or {}).items()}

    def app_on(self, model: str, device_type: str) -> PolluxApplication:
        """The application ``model`` as measured on ``device_type`` (its one profile when
        the model has no per-type profiles)."""
        if not self.typed:
            return self.pollux[model]
        apps = self.typed.get(device_type)
        if apps is None or model not in apps:
            raise ConfigError(f"perf model: no profile of {model!r} on GPU type "
                              f"{device_type!r} (typed: {', '.join(sorted(self.typed))})")
        return apps[model]

    def profile(self, model: str) -> ModelProfile:
        p = self.profiles.get(model)
        if p is None:
            raise ConfigError(f"perf model: unknown model {model!r} "
                              f"(known: {', '.join(sorted(self.profiles))})")
        return p

    def _multiplier(self, a: float, counts_len: int, extra: int, racks: int, zones: int,
                    gpus: int) -> float:
        level = 1.0 + 0.25 * (racks > 1) + 0.5 * (zones > 1)
        return 1.0 + a * ((1.0 - 1.0 / counts_len) * level + 0.1 * extra / gpus)

    def is_step_based(self, spec: JobSpec) -> bool:
        return spec.batch_size > 0 and spec.model in self.pollux

    def isolated_rate(self, spec: JobSpec, shape: Shape, topology: Topology) -> float:
        """Rate without neighbours: locality x device x cpu."""
        prof = self.profile(spec.model)
        if self.is_step_based(spec):
            rate = 1.0 / self.pollux[spec.model].step_time(shape.server_counts, spec.batch_size)
        else:
            counts, extra, racks, zones = ideal_shape(spec.gpus, topology)
            m0 = self._multiplier(prof.spread_penalty, len(counts), extra, racks, zones,
                                  spec.gpus)
            m = self._multiplier(prof.spread_penalty, len(shape.server_counts),
                                 shape.extra_switches, shape.racks, shape.zones, spec.gpus)
            rate = m0 / m
        rate *= shape.device_speed_min
        if self.options.cpu and shape.cpu_share < 1.0:
            rate *= shape.cpu_share ** prof.cpu_sensitivity
        return rate

    def interference_factor(self, spec: JobSpec, crowding: float) -> float:
        """``crowding`` = the worst server's weighted neighbour load (see module doc)."""
        if not self.options.interference or crowding <= 0.0:
            return 1.0
        if self.co is not None:   # pairwise: the crowding is already the job's own load
            return 1.0 / (1.0 + crowding)
        return 1.0 / (1.0 + self.profile(spec.model).interference * crowding)
