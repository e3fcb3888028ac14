"""The one catalog of elastic policies, for ``phalanx simulate`` and ``phalanx schedule``
alike: a name and a factory from :class:`ElasticInputs`, the facts an engine has. The
simulator fills them from measured profiles (``sim/run.py``), the live cluster from its
job list and its device types' declared speeds (``live/live_policies.py``); a policy that
needs what an engine cannot give (Gavel: every job's measured throughput on every type)
says so in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields

from phalanx.catalog import Catalog
from phalanx.cluster.core.view import ElasticPolicy
from phalanx.cluster.model.learned import Facts
from phalanx.cluster.model.profiles import PolluxApplication
from phalanx.cluster.policies.gavel import GavelPolicy
from phalanx.cluster.policies.goodput import GoodputOptions, GoodputPolicy
from phalanx.cluster.policies.goodput_learned import LearnedGoodputPolicy, LearnedOptions
from phalanx.cluster.policies.goodput_typed import TypedGoodputPolicy, TypedOptions
from phalanx.cluster.policies.pollux import PolluxOptions, PolluxPolicy
from phalanx.cluster.policies.pollux_unaware import UnawarePolluxPolicy, unaware_layout
from phalanx.cluster.policies.sia import SiaPolicy
from phalanx.cluster.policies.typed_base import TypeInfo, cluster_types
from phalanx.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class ElasticInputs:
    """What an elastic policy is built from. ``apps``: each application's facts (the
    cluster as one type); ``typed``: per device type (empty: no per-type facts);
    ``measured``: the facts are measured profiles (what the oracle ablation and Gavel
    read), not only what a job declares; ``bootstrap``: each type's 1-GPU throughput per
    application where no profile gives it (a live cluster: declared speeds)."""

    cluster: str                                 # its name, for messages
    typed_hint: str = "--cluster sia-64"         # how to get a cluster with types
    server_sizes: tuple[int, ...]
    server_types: tuple[str, ...]
    server_ids: tuple[int, ...] = ()             # each server's index (default: order)
    apps: Mapping[str, Facts]
    typed: Mapping[str, Mapping[str, Facts]] = field(default_factory=dict)
    measured: bool = True
    # the per-type goodput policy: None, where the cluster has several types with per-type
    # facts (simulation); a live cluster that declares device types: always
    by_type: bool | None = None
    bootstrap: Mapping[str, Mapping[str, float]] | None = None
    restart_s: float = 30.0
    restart_by_app: Mapping[str, float] = field(default_factory=dict)
    seed: int = 0
    interval_s: float | None = None              # None: the policy's own cadence
    goodput: GoodputOptions = field(default_factory=GoodputOptions)
    learned: LearnedOptions = field(default_factory=LearnedOptions)
    typed_options: TypedOptions = field(default_factory=TypedOptions)
    pollux: PolluxOptions = field(default_factory=PolluxOptions)
    # (job id, GPUs) -> how much slower a step runs for want of CPU cores (live CPU jobs)
    slowdown: Callable[[int, int], float] | None = None

    @property
    def several_types(self) -> bool:
        return len(set(self.server_types)) > 1

    def types(self, policy: str) -> tuple[TypeInfo, ...]:
        """The cluster's types for a policy that needs per-type facts (one line if none)."""
        if not self.typed:
            raise ConfigError(f"--policy {policy}: needs a cluster whose GPU types have "
                              f"per-type profiles ({self.typed_hint}), not {self.cluster}")
        if self.goodput.profiles != "learned":
            raise ConfigError(f"--policy {policy}: --profiles oracle is for --policy goodput")
        return cluster_types(list(zip(self.server_types, self.server_sizes, strict=True)))


# the sections' defaults, against which a section given to the policy that will not read it
# is found
_LEARNED, _TYPED = LearnedOptions(), TypedOptions()


def unread(section: object, default: object) -> list[str]:
    """The fields of ``section`` set away from ``default``: what a run gave a policy that
    will not read it."""
    return [f.name for f in fields(section)  # type: ignore[arg-type]
            if getattr(section, f.name) != getattr(default, f.name)]


def _goodput(x: ElasticInputs) -> ElasticPolicy:
    """``--profiles learned``: what Pollux knows; ``oracle``: every measured profile; on
    several GPU types, the heterogeneity-aware policy on the information Sia has. Both
    read the goodput section (its horizon); beside it each reads its own (``learned`` or
    ``typed``), and one given to the other is refused: which of the two runs depends on
    the cluster, so no shape of the options can rule it out (``learned.share`` on
    ``sia-64`` once ran plain goodput under a "share" label)."""
    g = x.goodput
    node_gpus = max(x.server_sizes)
    by_type = x.by_type if x.by_type is not None else bool(x.typed) and x.several_types
    own, other = ("typed", "learned") if by_type else ("learned", "typed")
    stray = unread(x.learned, _LEARNED) if by_type else unread(x.typed_options, _TYPED)
    if stray:
        names = ", ".join(f"{other}.{n}" for n in stray)
        raise ConfigError(f"--policy goodput on {x.cluster}: {names} not read: the {own} "
                          f"goodput policy runs here and reads its own section ({own}.*)")
    if by_type:
        if g.profiles != "learned" or g.priority != "none":
            raise ConfigError("--policy goodput on several GPU types: learned profiles and "
                              "--goodput-priority none only")
        return TypedGoodputPolicy(x.typed, x.types("goodput"), options=x.typed_options,
                                  restart_s=x.restart_by_app, horizon_s=g.horizon_s,
                                  bootstrap=x.bootstrap)
    if g.profiles == "learned":
        if g.batch == "fixed":
            raise ConfigError("--goodput-batch fixed: an ablation of the oracle policy; "
                              "add --profiles oracle")
        return LearnedGoodputPolicy(x.apps, node_gpus, x.restart_s, g.horizon_s, g.priority,
                                    x.learned, slowdown=x.slowdown)
    if not x.measured:
        raise ConfigError("--profiles oracle: reads every measured profile, which this "
                          "cluster's jobs do not have")
    return GoodputPolicy(x.apps, node_gpus, x.restart_s, g.horizon_s, g.priority,
                         fixed_batch=g.batch == "fixed")


def _pollux(x: ElasticInputs) -> ElasticPolicy:
    if x.goodput.profiles != "learned":
        raise ConfigError("--policy pollux: learns its throughput model; --profiles "
                          "oracle is for --policy goodput")
    o = x.pollux
    if x.several_types:
        # heterogeneity-unaware, as Sia ran it: one homogenised cluster of virtual nodes,
        # facts of its first type (aws), no job above the smallest type's GPUs
        vsizes, owner = unaware_layout(x.server_sizes)
        smallest = min(sum(g for g, t in zip(x.server_sizes, x.server_types, strict=True)
                           if t == want) for want in set(x.server_types))
        return UnawarePolluxPolicy(x.typed.get("aws") or x.apps, vsizes, seed=x.seed,
                                   generations=o.generations, search=o.search,
                                   restart_s=x.restart_s,
                                   vnode_server=owner, server_types=x.server_types,
                                   max_gpus=smallest)
    return PolluxPolicy(x.apps, x.server_sizes, seed=x.seed, generations=o.generations,
                        search=o.search, restart_s=x.restart_s)


def _sia(x: ElasticInputs) -> ElasticPolicy:
    return SiaPolicy(x.typed, x.types("sia"), bootstrap=x.bootstrap)


def _gavel(x: ElasticInputs) -> ElasticPolicy:
    types = x.types("gavel")
    if not x.measured:
        raise ConfigError("--policy gavel: reads every job's measured throughput on every "
                          "GPU type (as Sia ran it), which a job list does not give; use "
                          "sia or goodput")
    servers: dict[str, tuple[int, ...]] = {}
    ids = x.server_ids or tuple(range(len(x.server_types)))
    for i, t in zip(ids, x.server_types, strict=True):
        servers[t] = servers.get(t, ()) + (i,)
    typed: Mapping[str, Mapping[str, PolluxApplication]] = x.typed   # type: ignore[assignment]
    return GavelPolicy(typed, types, x.interval_s if x.interval_s is not None else 360.0,
                       servers)


# every elastic --policy (GPUs and batch per job): adding one is its class and one line
# here; an entry makes the policy from the engine's inputs
ElasticFactory = Callable[[ElasticInputs], ElasticPolicy]
ELASTIC: Catalog[ElasticFactory] = Catalog("elastic policy", "--policy")
ELASTIC.add("goodput", _goodput, "GPUs and batch per job by goodput (learned or oracle)")
ELASTIC.add("pollux", _pollux, "the Pollux artifact's policy")
ELASTIC.add("sia", _sia, "the Sia artifact's MILP policy (GPU types)")
ELASTIC.add("gavel", _gavel, "Gavel's max-sum-throughput, as Sia ran it (GPU types)")
