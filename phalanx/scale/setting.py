"""What a prediction is asked about (a strategy and its settings, stragglers, compression)
and what it answers (:class:`Prediction`). Each setting is checked once, here, with a
one-line error that names its flag."""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass, field

from phalanx.errors import ConfigError

STRATEGIES = ("single", "sync", "average", "bsp", "asp", "ssp", "softsync", "downpour",
              "dc-asgd", "hogwild", "model-parallel", "pipeline", "hybrid", "tensor",
              "sandblaster", "zero", "fsdp")
ASYNC = ("asp", "ssp", "softsync", "downpour", "dc-asgd")
PS_FAMILY = ("bsp", "sandblaster", *ASYNC)


@dataclass(frozen=True)
class Compression:
    """Bytes on the wire per gradient byte, and whether the exchange is an all-gather of
    sparse (index, value) pairs (top-k cannot be summed in a ring)."""

    name: str
    dense_scale: float = 1.0
    topk: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Compression:
        fixed = {"none": 1.0, "fp16": 0.5, "bf16": 0.5, "int8": 0.25}
        if text in fixed:
            return cls(text, fixed[text])
        kind, _, value = text.partition(":")
        try:
            v = float(value)
        except ValueError:
            v = math.nan
        if kind == "topk" and 0 < v <= 1:
            return cls(text, 1.0, v)
        if kind == "ratio" and v >= 1:
            return cls(text, 1.0 / v)
        raise ConfigError(f"--compress: {text!r} is not none, fp16, bf16, int8, topk:F "
                          f"(0 < F <= 1) or ratio:R (R >= 1)")


@dataclass(frozen=True)
class Stragglers:
    """Worker speed: each step's compute is multiplied by a factor drawn per worker and
    step. ``lognormal:SIGMA`` (mean 1) or ``slow:K:F`` (K workers F times slower)."""

    text: str = "none"

    def __post_init__(self) -> None:
        self.factors(4, random.Random(0))  # refuse a bad spec at once

    def factors(self, n: int, rng: random.Random) -> list[float]:
        kind, *rest = self.text.split(":")
        try:
            if kind == "none" and not rest:
                return [1.0] * n
            if kind == "lognormal" and len(rest) == 1 and 0 <= float(rest[0]) <= 2:
                s = float(rest[0])
                return [rng.lognormvariate(-s * s / 2, s) for _ in range(n)]
            if kind == "slow" and len(rest) == 2 and int(rest[0]) >= 0 and float(rest[1]) >= 1:
                k, f = int(rest[0]), float(rest[1])
                return [f if i < k else 1.0 for i in range(n)]
        except ValueError:
            pass
        raise ConfigError(f"--stragglers: {self.text!r} is not none, lognormal:SIGMA "
                          f"(0..2) or slow:K:FACTOR (FACTOR >= 1)")

    def expected_max(self, n: int, trials: int = 64) -> float:
        """E[max over n workers of the factor]: what a barrier waits for (seeded MC)."""
        return _expected_max(self, n, trials)

    def mean(self, n: int) -> float:
        """Mean factor: what an asynchronous worker's rate averages over."""
        if self.text.startswith("slow"):
            return sum(self.factors(n, random.Random(0))) / n
        return 1.0


@functools.lru_cache(maxsize=1024)
def _expected_max(stragglers: Stragglers, n: int, trials: int) -> float:
    if stragglers.text == "none":
        return 1.0
    rng = random.Random(12345)
    return sum(max(stragglers.factors(n, rng)) for _ in range(trials)) / trials


@dataclass(frozen=True, kw_only=True)
class Setting:
    strategy: str
    workers: int
    servers: int = 1
    allreduce: str = "ring"
    bucket_mb: float = 25.0
    # sync: Horovod's tensor fusion, a bucket closes after this much backward or at
    # bucket_mb (0: DDP's buckets, by size alone)
    fusion_cycle_ms: float = 0.0
    compress: Compression = Compression("none")
    period: int = 8
    staleness: int = 4
    softsync: int = 1
    nfetch: int = 1
    npush: int = 1
    stages: int = 0          # pipeline / hybrid stages (0: pipeline uses all workers)
    micro_batches: int = 4
    tensor: int = 1
    zero_stage: int = 2      # zero: 1 optimizer state, 2 + gradients, 3 + parameters
    server_placement: str = "dedicated"   # or colocated (a shard on each worker's server)
    duplex: bool = False      # pushes and pulls overlap (BytePS); phalanx's worker: no
    sparse_allreduce: bool = False  # sync: the CTR table's rows all-gathered after backward
    server_byte_s: float = 0.25e-9        # shard apply cost per byte (assumption)
    server_msg_s: float = 20e-6           # shard cost per message (assumption)
    stragglers: Stragglers = Stragglers()

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"--strategy: {self.strategy!r} is not one of "
                              f"{', '.join(STRATEGIES)}")
        checks = [("--workers", self.workers, 1, 1 << 20), ("--servers", self.servers, 1, 4096),
                  ("--period", self.period, 1, 10**6), ("--staleness", self.staleness, 0, 10**6),
                  ("--softsync", self.softsync, 1, 1 << 20), ("--nfetch", self.nfetch, 1, 10**6),
                  ("--npush", self.npush, 1, 10**6), ("--stages", self.stages, 0, 1 << 20),
                  ("--micro-batches", self.micro_batches, 1, 1 << 16),
                  ("--tensor", self.tensor, 1, 1024), ("--zero-stage", self.zero_stage, 1, 3)]
        for flag, v, lo, hi in checks:
            if not isinstance(v, int) or not lo <= v <= hi:
                raise ConfigError(f"{flag}: {v!r} is not an integer in {lo}..{hi}")
        if not 0 <= self.bucket_mb <= 4096:
            raise ConfigError(f"--bucket-mb: {self.bucket_mb} is not in 0..4096 (0: no overlap)")
        if not 0 <= self.fusion_cycle_ms <= 10_000:
            raise ConfigError(f"--fusion-cycle-ms: {self.fusion_cycle_ms} is not in "
                              f"0..10000 (0: buckets by size alone)")
        if self.server_placement not in ("dedicated", "colocated"):
            raise ConfigError(f"--server-placement: {self.server_placement!r} is not "
                              f"dedicated or colocated")
        if self.strategy == "single" and self.workers != 1:
            raise ConfigError("--workers: single trains on one worker")
        if self.strategy == "tensor" and self.workers % self.tensor:
            raise ConfigError(f"--tensor: {self.tensor} does not divide --workers "
                              f"{self.workers}")
        if self.strategy == "hybrid" and self.stages and self.workers % self.stages:
            raise ConfigError(f"--stages: {self.stages} does not divide --workers "
                              f"{self.workers}")


@dataclass(frozen=True)
class Prediction:
    """One step of one worker (a data-parallel replica for pipelines): the time and where it
    goes. ``step_s`` = compute + exposed comm + server + bubble + straggler (the parts add
    up); asynchronous strategies report the mean cycle of a worker."""

    strategy: str
    workers: int
    step_s: float
    compute_s: float
    exposed_comm_s: float
    comm_s: float
    server_s: float
    bubble_s: float
    straggler_s: float
    bytes_per_worker: float
    bytes_by_level: dict[str, float]
    bottleneck: str
    samples_per_step: float
    samples_per_s: float
    efficiency: float
    staleness_mean: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    # messages the busiest worker sends a step, each answered by one it receives (the
    # per-message framing of the bytes on the wire: scale/wire_check.py)
    messages: float = 0.0

    def row(self) -> dict[str, object]:
        return {"strategy": self.strategy, "workers": self.workers,
                "step_ms": round(self.step_s * 1e3, 4),
                "compute_ms": round(self.compute_s * 1e3, 4),
                "exposed_comm_ms": round(self.exposed_comm_s * 1e3, 4),
                "comm_ms": round(self.comm_s * 1e3, 4),
                "server_ms": round(self.server_s * 1e3, 4),
                "bubble_ms": round(self.bubble_s * 1e3, 4),
                "straggler_ms": round(self.straggler_s * 1e3, 4),
                "mb_per_worker": round(self.bytes_per_worker / 1e6, 6),
                "messages_per_worker": round(self.messages, 4),
                "bottleneck": self.bottleneck,
                "samples_per_s": round(self.samples_per_s, 3),
                "efficiency": round(self.efficiency, 4),
                "staleness_mean": (None if self.staleness_mean is None
                                   else round(self.staleness_mean, 3))}
