"""A discrete-event simulation of N workers against S parameter-server shards: queueing at the
shards (incast), barriers (BSP, SSP), and the staleness of every applied update come out of
it, not from a formula.

One worker's step: compute (times its straggler factor) -> push its gradient to every shard
-> the shard applies it -> pull the weights back -> next step. Each shard has three FIFO
servers in a row: its NIC's receive side (push bytes / shard bandwidth), its CPU (per
message + per byte), its NIC's send side (pull bytes / shard bandwidth). A worker's own NIC
sends its S pieces at once, so a push takes at least push bytes / worker bandwidth.

Links as calibrated (``burst_bytes``, ``duplex``): each of those servers, and each worker's
own send and receive side, is a token bucket (tc tbf's, as ``scale/network.py`` has it): a
transfer of x bytes that finds k bytes of credit takes max(0, x - k) / bandwidth, and the
credit refills at the bandwidth, up to the burst, only while that side is idle; so the
bucket pays a worker that waits in compute and not a shard busy back to back, with no rule
for which. Without BSP's barrier a shard receives one worker's push while another's pull
leaves: its two sides run at ``duplex`` x the bandwidth (BSP's pushes and pulls take turns).

Shared cores (``cores``, 0 for one core a worker): the workers' processes compute on that
many cores, time-sliced as the kernel does it (processor sharing: k workers computing at
once each get min(1, cores / k) of a core). Three workers on two cores that compute at the
same time, as BSP's release them, each take 1.5 x their compute; a worker that waits on its
link leaves its core to the others.

Shards are symmetric (every worker splits every push evenly over them and pushes to all at
once), so all S shards see the same arrivals at the same times: one representative shard is
simulated exactly, with 1/S of the bytes.

Consistency (as ``phalanx/ps/consistency.py``): ``asp`` applies each push at once; ``bsp``
applies the N pushes of a clock together and releases the pulls after; ``ssp`` (bound s):
a worker may start clock c only when every worker has pushed clock c-s-1; ``softsync`` (k):
the shard's version advances after every k applied pushes. Staleness of an update = versions
the shard applied between the worker's pull (of the weights it computed on) and this apply.

Cost: one heap event per worker step. FIFO queues fed in time order are computed with
Lindley's recursion when the push arrives, and a pull's version is read back at the worker's
next push (every apply before the pull's start is known by then), so 4,096 workers x 1,000
steps is ~4M events.
"""

from __future__ import annotations

import heapq
import random
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass

from phalanx.errors import ConfigError
from phalanx.scale.setting import Stragglers

CONSISTENCY = ("asp", "bsp", "ssp", "softsync")


@dataclass(frozen=True, kw_only=True)
class AsyncSpec:
    workers: int
    shards: int
    steps: int                  # steps per worker
    compute_s: float
    push_bytes: float           # per worker per step, all shards together
    pull_bytes: float
    worker_bw: float            # bytes/s of a worker's NIC
    shard_bw: float             # bytes/s of a shard's NIC
    latency_s: float = 0.0      # one way, per message
    burst_bytes: float = 0.0    # each NIC side's token bucket (0: a fluid link)
    duplex: float = 1.0         # a shard's per-direction share with both directions busy
    server_msg_s: float = 0.0
    server_byte_s: float = 0.0
    consistency: str = "asp"
    bound: int = 0              # ssp: staleness bound s; softsync: k pushes per version
    stragglers: Stragglers = Stragglers()
    seed: int = 0
    cores: int = 0              # the workers share this many cores (0: one each)

    def __post_init__(self) -> None:
        if self.consistency not in CONSISTENCY:
            raise ConfigError(f"--consistency: {self.consistency!r} is not one of "
                              f"{', '.join(CONSISTENCY)}")
        for flag, v in (("--workers", self.workers), ("--servers", self.shards),
                        ("--steps", self.steps)):
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"{flag}: {v!r} is not a positive integer")
        if not isinstance(self.cores, int) or self.cores < 0:
            raise ConfigError(f"--cores: {self.cores!r} is not a whole number >= 0")
        if self.workers * self.steps > 50_000_000:
            raise ConfigError(f"--steps: {self.workers} x {self.steps} worker steps is more "
                              f"than 50 million")
        if self.consistency == "softsync" and self.bound < 1:
            raise ConfigError("--softsync: must be >= 1")
        if not (self.worker_bw > 0 and self.shard_bw > 0 and self.compute_s > 0):
            raise ConfigError("bandwidths and compute time must be > 0")
        if not (self.burst_bytes >= 0 and 0 < self.duplex <= 1):
            raise ConfigError(f"burst must be >= 0 and duplex in (0, 1], got "
                              f"{self.burst_bytes!r}, {self.duplex!r}")


@dataclass(frozen=True)
class AsyncResult:
    wall_s: float                 # simulated time until every worker finished its steps
    step_s: float                 # mean time per step of a worker
    updates_per_s: float
    staleness: dict[int, int]     # staleness -> count of applied updates
    staleness_mean: float
    staleness_p99: int
    staleness_max: int
    push_wait_s: float            # mean wait in the shard's receive queue
    barrier_wait_s: float         # mean time a worker waited at a barrier per step
    shard_busy: float             # fraction of the wall time the shard's receive side works

    def row(self) -> dict[str, object]:
        return {"wall_s": round(self.wall_s, 6), "step_ms": round(self.step_s * 1e3, 4),
                "updates_per_s": round(self.updates_per_s, 3),
                "staleness_mean": round(self.staleness_mean, 4),
                "staleness_p99": self.staleness_p99, "staleness_max": self.staleness_max,
                "push_wait_ms": round(self.push_wait_s * 1e3, 4),
                "barrier_wait_ms": round(self.barrier_wait_s * 1e3, 4),
                "shard_busy": round(self.shard_busy, 4)}


class _Bucket:
    """One side of a NIC: a FIFO whose token bucket (``burst`` bytes, refilled at ``bw``
    while idle) lets a transfer's first bytes pass at once."""

    __slots__ = ("bw", "burst", "free", "tokens")

    def __init__(self, bw: float, burst: float) -> None:
        self.bw, self.burst, self.free, self.tokens = bw, burst, 0.0, burst

    def serve(self, t: float, nbytes: float) -> tuple[float, float]:
        """(start, end) of ``nbytes`` arriving at ``t``."""
        start = max(t, self.free)
        credit = min(self.burst, self.tokens + (start - self.free) * self.bw)
        if nbytes <= credit:
            self.tokens, end = credit - nbytes, start
        else:
            self.tokens, end = 0.0, start + (nbytes - credit) / self.bw
        self.free = end
        return start, end


def simulate(spec: AsyncSpec) -> AsyncResult:  # noqa: C901 - one event loop, kept whole
    n, steps = spec.workers, spec.steps
    rng = random.Random(spec.seed)
    strag = spec.stragglers
    lognormal = strag.text.startswith("lognormal")
    fixed = strag.factors(n, random.Random(spec.seed))
    sigma = float(strag.text.split(":")[1]) if lognormal else 0.0
    mu = -sigma * sigma / 2
    c = spec.compute_s
    push_piece, pull_piece = spec.push_bytes / spec.shards, spec.pull_bytes / spec.shards
    shard_bw = spec.shard_bw * (spec.duplex if spec.consistency != "bsp" else 1.0)
    burst = spec.burst_bytes
    # the representative shard's receive and send sides (its 1/S of the bytes, its own
    # NIC's buckets), and each worker's own
    inbox, outbox = _Bucket(shard_bw, burst), _Bucket(shard_bw, burst)
    own_out = [_Bucket(spec.worker_bw, burst) for _ in range(n)]
    own_in = [_Bucket(spec.worker_bw, burst) for _ in range(n)]
    apply_s = spec.server_msg_s + push_piece * spec.server_byte_s
    lat = spec.latency_s
    mode = spec.consistency
    k_soft = spec.bound if mode == "softsync" else 1

    cpu_free = 0.0
    applies: list[float] = []         # completion times of applied pushes, increasing
    read_at = [0.0] * n               # when each worker's last pull read the weights
    read_version = [0] * n            # bsp: the version read (known at release)
    hist: Counter[int] = Counter()
    wait_sum = busy = barrier_sum = 0.0
    done_steps = [0] * n
    finished = 0.0
    # ssp / bsp bookkeeping: how many workers pushed each clock; who waits for what
    pushed = [0] * (steps + 2)
    min_clock = 0
    blocked: dict[int, list[tuple[int, float]]] = {}  # clock needed -> (worker, since)
    bsp_version = 0

    def draw(w: int) -> float:
        return c * (rng.lognormvariate(mu, sigma) if lognormal else fixed[w])

    # the workers' compute on ``spec.cores`` shared cores, as the kernel time-slices it
    # (processor sharing): with k workers computing each runs at min(1, cores / k) of a
    # core. Virtual time v advances at that rate; a compute of c seconds started at virtual
    # time v0 ends when v reaches v0 + c, so the jobs end in order of those tags
    cores = spec.cores
    cpu: list[tuple[float, int]] = []  # (virtual end, worker)
    v_now = t_now = 0.0

    def cpu_rate() -> float:
        return min(1.0, cores / len(cpu)) if cpu else 1.0

    def cpu_advance(t: float) -> None:
        nonlocal v_now, t_now
        v_now += (t - t_now) * cpu_rate()
        t_now = t

    def compute(w: int, t: float) -> None:
        """Worker w starts its next step's compute at time t."""
        work = draw(w)
        if cores:
            heapq.heappush(events, (t, 1, w, work))   # its compute joins the cores at t
        else:
            heapq.heappush(events, (t + work, 0, w, 0.0))   # its push, at the end

    def pull(w: int, t: float) -> float:
        """Queue worker w's pull at time t; returns when its weights have arrived."""
        start, sent = outbox.serve(t + lat, pull_piece)
        read_at[w] = start
        _, got = own_in[w].serve(t + lat, spec.pull_bytes)
        return max(sent, got) + lat

    # (time, kind, worker, compute seconds): kind 0 a compute's end (the push), 1 its start
    events: list[tuple[float, int, int, float]] = []
    for w in range(n):
        compute(w, 0.0)
    while events or cpu:
        t_cpu = t_now + (cpu[0][0] - v_now) / cpu_rate() if cpu else float("inf")
        if events and events[0][0] <= t_cpu:
            t, kind, w, work = heapq.heappop(events)
            if kind == 1:
                cpu_advance(t)
                heapq.heappush(cpu, (v_now + work, w))
                continue
        else:
            cpu_advance(t_cpu)
            _, w = heapq.heappop(cpu)
            t = t_cpu
        # this push: worker w's clock done_steps[w]; its weights were read at read_at[w]
        clock = done_steps[w]
        if mode != "bsp":
            version = bisect_right(applies, read_at[w]) // k_soft
        arrive = t + lat
        start, taken = inbox.serve(arrive, push_piece)
        wait_sum += start - arrive
        busy += taken - start
        _, sent = own_out[w].serve(t, spec.push_bytes)
        got = max(taken, sent + lat)
        applied = max(got, cpu_free) + apply_s
        cpu_free = applied
        applies.append(applied)
        done_steps[w] += 1
        if mode == "bsp":
            hist[0] += 1
        else:
            hist[max(0, (len(applies) - 1) // k_soft - version)] += 1
        pushed[clock] += 1
        if mode == "ssp":  # a finished clock may release workers that wait for it
            while min_clock < steps and pushed[min_clock] == n:
                min_clock += 1
                for v, since in blocked.pop(min_clock + spec.bound, []):
                    barrier_sum += max(0.0, t - since)
                    compute(v, max(t, since))
        if done_steps[w] == steps:
            finished = max(finished, applied)
        if mode == "bsp":
            if pushed[clock] < n:
                blocked.setdefault(clock, []).append((w, applied))
                continue
            bsp_version += 1
            for v, since in blocked.pop(clock, []) + [(w, applied)]:
                barrier_sum += applied - since
                read_version[v] = bsp_version
                if done_steps[v] < steps:
                    compute(v, pull(v, applied))
            continue
        if done_steps[w] == steps:
            continue
        ready = pull(w, applied)
        if mode == "ssp":
            need = done_steps[w] - spec.bound  # to start clock done_steps[w]
            if need > min_clock:
                blocked.setdefault(done_steps[w], []).append((w, ready))
                continue
        compute(w, ready)
    total = n * steps
    counts = sorted(hist.items())
    acc, p99 = 0, 0
    for s, k in counts:
        acc += k
        if acc >= 0.99 * total:
            p99 = s
            break
    mean = sum(s * k for s, k in counts) / total
    wall = max(finished, applies[-1] if applies else 0.0)
    return AsyncResult(wall, wall / steps, total / wall if wall else 0.0, dict(counts), mean,
                       p99, counts[-1][0] if counts else 0, wait_sum / total,
                       barrier_sum / total, busy / wall if wall else 0.0)
