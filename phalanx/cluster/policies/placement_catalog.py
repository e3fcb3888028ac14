"""Every ``--placement``: its options (``PlacementOptions``, checked once) and its
factory, one line each in ``PLACEMENTS``; the policies themselves are in
``placement.py``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from phalanx.catalog import Catalog
from phalanx.cluster.model.interference import CoLocation
from phalanx.cluster.policies.placement import (
    FirstFit,
    LoadAdaptive,
    MostFreeFirst,
    Pack,
    PlacementPolicy,
    Spread,
    SpreadKeepEmpty,
    TopologyAware,
)
from phalanx.cluster.policies.placement_interference import InterferenceAware
from phalanx.errors import ConfigError


def _load_adaptive_demand(threshold: float = 0.5, hysteresis: float = 0.2) -> LoadAdaptive:
    """Load-adaptive judged on demand (busy + queued GPUs), with hysteresis."""
    return LoadAdaptive(threshold, signal="demand", hysteresis=min(hysteresis, threshold),
                        name="load-adaptive-demand")


@dataclass(frozen=True, kw_only=True)
class PlacementOptions:
    """The placement policies' own settings (``--threshold``, ``--hysteresis``), checked
    here once. ``hysteresis`` None: the policy's default (load-adaptive 0,
    load-adaptive-demand 0.2)."""

    threshold: float = 0.5
    hysteresis: float | None = None
    # the pair table the run loaded (--interference-pairs): what ``interference`` weighs
    co: CoLocation | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ConfigError(f"--threshold must be in [0, 1], got {self.threshold}")
        if self.hysteresis is not None and not 0.0 <= self.hysteresis <= self.threshold:
            raise ConfigError(f"--hysteresis must be in [0, threshold={self.threshold}], "
                              f"got {self.hysteresis}")


# every placement --placement offers: adding one is its class and one line here; an entry
# makes a fresh policy (load-adaptive keeps its mode: one object per run) from the options
PlacementFactory = Callable[[PlacementOptions], PlacementPolicy]
PLACEMENTS: Catalog[PlacementFactory] = Catalog("placement policy", "--placement")
PLACEMENTS.add("first-fit", lambda o: FirstFit(), "first server that holds the gang")
PLACEMENTS.add("pack", lambda o: Pack(), "fullest server that holds the gang (best fit)")
PLACEMENTS.add("spread", lambda o: Spread(), "emptiest server, emptiest PCIe switch")
PLACEMENTS.add("spread-keep-empty", lambda o: SpreadKeepEmpty(),
               "spread over partly used servers, keeping empty ones empty")
PLACEMENTS.add("load-adaptive", lambda o: LoadAdaptive(threshold=o.threshold,
                                                       hysteresis=o.hysteresis or 0.0),
               "spread below --threshold utilisation, pack above")
PLACEMENTS.add("load-adaptive-demand", lambda o: _load_adaptive_demand(
    o.threshold, 0.2 if o.hysteresis is None else o.hysteresis),
               "load-adaptive on demand (busy + queued GPUs), with hysteresis")
PLACEMENTS.add("topology", lambda o: TopologyAware(), "smallest span: switch, server, rack")
PLACEMENTS.add("count", lambda o: MostFreeFirst(), "by GPU count, most free server first")


def _interference(o: PlacementOptions) -> InterferenceAware:
    if o.co is None:
        raise ConfigError("--placement interference weighs measured pairs: give "
                          "--interference-pairs gavel or an interference.json")
    return InterferenceAware(o.co, threshold=o.threshold)


PLACEMENTS.add("interference", _interference,
               "least throughput lost to co-location by the pair table; ties packed")


def make_placement(name: str, threshold: float = 0.5,
                   hysteresis: float | None = None, co: CoLocation | None = None
                   ) -> PlacementPolicy:
    """A fresh policy object (load-adaptive keeps its mode: one object per run)."""
    if name not in PLACEMENTS:
        raise ConfigError(f"--placement {name}: unknown (choose from {', '.join(PLACEMENTS)})")
    return PLACEMENTS.get(name)(PlacementOptions(threshold=threshold, hysteresis=hysteresis,
                                                 co=co))
