"""The one catalog of elastic policies, for ``phalanx simulate`` and ``phalanx schedule``
alike: a name and a factory from :class:`ElasticInputs`, the facts an engine has. The
simulator fills them from measured profiles (``sim/run.py``), the live cluster from its
job list and its device types' declared speeds (``live/live_policies.py``); a policy that
needs what an engine cannot give (Gavel: every job's measured throughput on every type)
says so in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace

from phalanx.catalog import Catalog
from phalanx.cluster.core.view import ElasticPolicy
from phalanx.cluster.model.learned import Facts
from phalanx.cluster.model.profiles import PolluxApplication
from phalanx.cluster.policies.gavel import GavelPolicy
from phalanx.cluster.policies.goodput import GoodputOptions, GoodputPolicy
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
    bootstrap: Mapping[str, Mapping[str, float]] | None = None
    restart_s: float = 30.0
    restart_by_app: Mapping[str, float] = field(default_factory=dict)
    seed: int = 0
    interval_s: float | None = None              # None: the policy's own cadence
    goodput: GoodputOptions = field(default_factory=GoodputOptions)
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


# the typed section's default, against which a section given to the oracle policy (which
# will not read it) is found
_TYPED = TypedOptions()


def unread(section: object, default: object) -> list[str]:
    """The fields of ``section`` set away from ``default``: what a run gave a policy that
    will not read it."""
    return [f.name for f in fields(section)  # type: ignore[arg-type]
            if getattr(section, f.name) != getattr(default, f.name)]


def _goodput(x: ElasticInputs) -> ElasticPolicy:
    """``--profiles learned`` (the default): one policy on every cluster, the goodput
    policy on the information Pollux and Sia have (``goodput_typed.py``). A cluster of one
    GPU type is a cluster of one type: the job's first size is valued by the GPUs alone
    (the 1-GPU bootstrap cancels when nothing is compared across types), so it reads no
    profile. ``--profiles oracle``: every measured profile (``goodput.py``, an ablation),
    which reads only the goodput section; a typed section given to it is refused."""
    g = x.goodput
    if g.profiles == "oracle":
        stray = unread(x.typed_options, _TYPED)
        if stray:
            names = ", ".join(f"typed.{n}" for n in stray)
            raise ConfigError(f"--policy goodput --profiles oracle: {names} not read (the "
                              f"typed section is the learned goodput policy's)")
        if x.several_types:
            raise ConfigError("--profiles oracle: one GPU type only; on several types "
                              "the goodput policy learns (--profiles learned)")
        if not x.measured:
            raise ConfigError("--profiles oracle: reads every measured profile, which this "
                              "cluster's jobs do not have")
        return GoodputPolicy(x.apps, max(x.server_sizes), x.restart_s, g.horizon_s,
                             g.priority, fixed_batch=g.batch == "fixed")
    if g.batch == "fixed":
        raise ConfigError("--goodput-batch fixed: an ablation of the oracle policy; "
                          "add --profiles oracle")
    typed, bootstrap = x.typed, x.bootstrap
    restart = dict(x.restart_by_app) or dict.fromkeys(x.apps, x.restart_s)
    if not typed and not x.several_types:
        # one type without per-type facts (a homogeneous simulated cluster): its facts are
        # the applications', and the 1-GPU bootstrap is 1 (it only compares types)
        (t,) = set(x.server_types)
        typed, bootstrap = {t: x.apps}, {t: dict.fromkeys(x.apps, 1.0)}
    types = replace(x, typed=typed).types("goodput")
    return TypedGoodputPolicy(typed, types, options=x.typed_options, restart_s=restart,
                              horizon_s=g.horizon_s, bootstrap=bootstrap,
                              priority=g.priority, slowdown=x.slowdown)


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
