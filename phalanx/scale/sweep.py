"""Every strategy at every N on one cluster shape, and the crossovers a user asks for: from
which N a parameter server with S = N/4 shards beats the ring, below which bandwidth
asynchronous training beats synchronous, below which bandwidth top-k 1% pays."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from phalanx.errors import ConfigError, PhalanxError
from phalanx.scale.convergence import Convergence
from phalanx.scale.network import Link, Links, Network, gbit, uniform_network
from phalanx.scale.predict import predict
from phalanx.scale.setting import STRATEGIES, Compression, Prediction, Setting, Stragglers
from phalanx.scale.workload import Workload

SWEEP_NS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
SWEEP_STRATEGIES = tuple(s for s in STRATEGIES if s != "single")  # the 14 beside the reference


@dataclass(frozen=True, kw_only=True)
class Shape:
    """How the sweep builds a cluster for N workers (the smallest uniform one that fits)."""

    gpus_per_server: int = 8
    servers_per_rack: int = 32
    nic_gbit: float = 25.0
    intra_gbit: float = 1200.0
    latency_us: float = 10.0
    oversubscription: float = 1.0

    def __post_init__(self) -> None:
        for flag, v in (("--gpus-per-server", self.gpus_per_server),
                        ("--servers-per-rack", self.servers_per_rack)):
            if not isinstance(v, int) or not 1 <= v <= 1024:
                raise ConfigError(f"{flag}: {v!r} is not an integer in 1..1024")
        for flag, v in (("--nic-gbit", self.nic_gbit), ("--intra-gbit", self.intra_gbit)):
            if not 1e-4 <= v <= 1e5:
                raise ConfigError(f"{flag}: {v!r} is not in 0.0001..100000 Gbit/s")
        if not 0 <= self.latency_us <= 1e6:
            raise ConfigError(f"--latency-us: {self.latency_us!r} is not in 0..1e6")
        if not 1 <= self.oversubscription <= 1000:
            raise ConfigError(f"--oversubscription: {self.oversubscription!r} is not in "
                              f"1..1000")

    def links(self) -> Links:
        lat = self.latency_us * 1e-6
        return Links(intra=Link(bandwidth=gbit(self.intra_gbit), latency=lat / 5),
                     nic=Link(bandwidth=gbit(self.nic_gbit), latency=lat),
                     rack=Link(bandwidth=gbit(self.nic_gbit), latency=lat / 2,
                               oversubscription=self.oversubscription),
                     zone=Link(bandwidth=gbit(self.nic_gbit), latency=lat / 2))

    def network(self, n: int) -> Network:
        return uniform_network(n, gpus_per_server=self.gpus_per_server,
                               servers_per_rack=self.servers_per_rack, links=self.links())


def default_setting(strategy: str, n: int, base: Setting | None = None) -> Setting:
    """A strategy's settings at N for a sweep: PS shards N/4, tensor degree 8, 4 stages
    for the hybrid, micro-batches 2 x stages for pipelines."""
    kw = {} if base is None else {f: getattr(base, f) for f in (
        "bucket_mb", "fusion_cycle_ms", "compress", "period", "staleness", "softsync",
        "nfetch", "npush", "server_placement", "duplex", "server_byte_s", "server_msg_s",
        "stragglers", "allreduce")}
    s = Setting(strategy=strategy, workers=n, servers=max(1, n // 4), **kw)
    if strategy == "tensor":
        s = replace(s, tensor=8 if n % 8 == 0 else 1)
    if strategy == "hybrid":
        s = replace(s, stages=4 if n % 4 == 0 else 1)
    if strategy in ("pipeline", "hybrid"):
        s = replace(s, micro_batches=2 * (s.stages or n))
    return s


@dataclass(frozen=True)
class Row:
    strategy: str
    workers: int
    prediction: Prediction | None
    skipped: str = ""


def sweep(w: Workload, strategies: Sequence[str], ns: Sequence[int],
          network: Callable[[int], Network], base: Setting | None = None) -> list[Row]:
    rows = []
    nets = {n: network(n) for n in ns}
    for strategy in strategies:
        for n in ns:
            try:
                rows.append(Row(strategy, n, predict(w, default_setting(strategy, n, base),
                                                     nets[n])))
            except PhalanxError as e:  # not defined here (hogwild across servers): say why
                rows.append(Row(strategy, n, None, str(e)))
    return rows


def _first_n(w: Workload, shape: Shape, ns: Sequence[int], wins: Callable[[Prediction,
             Prediction], bool], a: Callable[[int], Setting], b: Callable[[int], Setting]
             ) -> int | None:
    for n in ns:
        net = shape.network(n)
        if wins(predict(w, a(n), net), predict(w, b(n), net)):
            return n
    return None


def _threshold_gbit(w: Workload, shape: Shape, n: int, a: Setting, b: Setting,
                    better: Callable[[Prediction, Prediction], bool] | None = None) -> str:
    """Where, on a log grid of NIC bandwidths 0.01..1000 Gbit/s, ``a`` is better than ``b``
    (default: more samples/s): 'below G', 'above G', 'never', 'always' (or the ranges)."""
    better = better or (lambda p, q: p.samples_per_s > q.samples_per_s)
    grid = [10 ** (k / 8) for k in range(-16, 25)]
    wins = []
    for g in grid:
        net = replace(shape, nic_gbit=g).network(n)
        wins.append(better(predict(w, a, net), predict(w, b, net)))
    if not any(wins):
        return "never (0.01..1000 Gbit/s)"
    if all(wins):
        return "always (0.01..1000 Gbit/s)"
    k = wins.index(not wins[0])
    if all(v == wins[0] for v in wins[:k]) and all(v != wins[0] for v in wins[k:]):
        return (f"below {grid[k - 1]:.3g} Gbit/s" if wins[0]
                else f"above {grid[k]:.3g} Gbit/s only")
    return "at " + ", ".join(f"{g:.3g}" for g, v in zip(grid, wins) if v) + " Gbit/s"


def _sooner(p: Prediction, q: Prediction) -> bool:
    conv = Convergence()
    return conv.time_to_target(p) < conv.time_to_target(q)


def crossovers(w: Workload, shape: Shape, ns: Sequence[int] = SWEEP_NS,
               async_n: int = 64) -> list[tuple[str, str]]:
    """(question, answer) rows of the crossover table."""
    out = []
    ring = lambda n: Setting(strategy="sync", workers=n)  # noqa: E731
    ps = lambda n: Setting(strategy="bsp", workers=n, servers=max(1, n // 4))  # noqa: E731
    n_ps = _first_n(w, shape, ns, lambda p, r: p.step_s < r.step_s, ps, ring)
    out.append((f"at {shape.nic_gbit:g} Gbit/s, PS (bsp, S = N/4 dedicated shards) beats the "
                f"ring from N =", "never in " + f"{ns[0]}..{ns[-1]}" if n_ps is None
                else str(n_ps)))
    for strag in ("none", "lognormal:0.5"):
        st = Stragglers(strag)
        g = _threshold_gbit(w, shape, async_n,
                            Setting(strategy="asp", workers=async_n,
                                    servers=max(1, async_n // 4), stragglers=st),
                            Setting(strategy="sync", workers=async_n, stragglers=st))
        out.append((f"at N = {async_n}, stragglers {strag}: asynchronous (asp, S = N/4) has "
                    f"more samples/s than the sync ring", g))
        g = _threshold_gbit(w, shape, async_n,
                            Setting(strategy="asp", workers=async_n,
                                    servers=max(1, async_n // 4), stragglers=st),
                            Setting(strategy="sync", workers=async_n, stragglers=st),
                            _sooner)
        out.append((f"at N = {async_n}, stragglers {strag}: asynchronous reaches the target "
                    f"sooner than the sync ring (convergence model)", g))
    g = _threshold_gbit(w, shape, async_n, Setting(strategy="sync", workers=async_n,
                                                   compress=Compression.parse("topk:0.01")),
                        Setting(strategy="sync", workers=async_n))
    out.append((f"at N = {async_n}, top-k 1% (all-gather of index, value pairs; compressing "
                f"costs no compute here) has more samples/s than no compression", g))
    return out
