"""The system layer: each collective and parameter-server exchange as a sequence of phases of
concurrent flows on the network layer (:mod:`phalanx.scale.network`).

Every algorithm repeats one flow pattern many times (the 2(N-1) steps of a ring move the same
chunk size between the same neighbours), so a collective costs one phase computed once and
multiplied: O(N) flows per prediction, not O(N^2), which is what lets 4,096 workers predict
in milliseconds.

Bytes per worker are the exact formulas of ``phalanx/comm/allreduce.py`` (re-derived here in
plain Python so the analytical core runs without torch; ``tests/unit/test_scale_model.py``
holds :func:`ring_bytes` to ``comm.allreduce.ring_bytes``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from phalanx.errors import ConfigError
from phalanx.scale.network import LEVELS, Flow, Network, PhaseCost

ALGORITHMS = ("ring", "tree", "hierarchical", "main")


@dataclass(frozen=True)
class CommCost:
    """Seconds of one exchange, bytes the busiest participant sends, bytes by link level
    (all participants), the level of the bottleneck of the slowest phase, and the number of
    messages the busiest participant sends, each answered by one it receives (a ring's
    steps, a pipeline's sends forward and back, a push and its pull: each message costs
    its framing on the wire, :data:`phalanx.scale.wire_check.FRAMING`)."""

    seconds: float
    bytes_per_worker: float
    bytes_by_level: dict[str, float] = field(default_factory=dict)
    bottleneck: str = "none"
    messages: float = 0.0
    # what the token buckets saved, already taken off ``seconds``: they are full only
    # after an idle gap at least as long (a strategy whose links are busy back to back
    # gives some of it back: predict._sync)
    credit_s: float = 0.0
    # the bottleneck bucket's whole credit (its burst at the bottleneck's rate): a bound on
    # what one idle gap can save, however many phases follow it
    burst_s: float = 0.0
    # latency hidden behind the bytes (the bucket refilled while it kept the link idle),
    # already taken off ``seconds``
    hidden_s: float = 0.0

    def __add__(self, other: CommCost) -> CommCost:
        levels = defaultdict(float, self.bytes_by_level)
        for k, v in other.bytes_by_level.items():
            levels[k] += v
        worst = self.bottleneck if self.seconds >= other.seconds else other.bottleneck
        return CommCost(self.seconds + other.seconds,
                        self.bytes_per_worker + other.bytes_per_worker, dict(levels), worst,
                        self.messages + other.messages, self.credit_s + other.credit_s,
                        max(self.burst_s, other.burst_s), self.hidden_s + other.hidden_s)

    def scaled(self, k: float) -> CommCost:
        """This exchange every 1/k steps (model averaging every k steps: scaled(1/k))."""
        return CommCost(self.seconds * k, self.bytes_per_worker * k,
                        {a: b * k for a, b in self.bytes_by_level.items()}, self.bottleneck,
                        self.messages * k, self.credit_s * k, self.burst_s * k,
                        self.hidden_s * k)


NONE = CommCost(0.0, 0.0)


def _repeat(p: PhaseCost, times: int, per_worker: float, messages: float) -> CommCost:
    """``times`` phases back to back, after an idle gap that filled the token buckets: the
    buckets refill only while idle, so the phases share one burst, each taking its bytes
    from what the ones before it left (a phase as large as the burst leaves nothing).
    Before each phase the link is idle for its latency (the message's software path): the
    bucket refills that long and the phase's bytes take it back at line rate, so a latency
    hides behind the bytes that follow it (``refill_s``, whatever came before: the first
    phase's too, as a gap shorter than the burst takes to refill leaves the bucket short of
    full). An idle gap's credit is what the bytes have left after that."""
    refill = min(p.refill_s, p.wire_s) * times
    credit = min(p.credit_s * times, p.burst_s, p.wire_s * times - refill) if times else 0.0
    return CommCost(p.seconds * times - credit - refill, per_worker,
                    {k: v * times for k, v in p.bytes_by_level.items()},
                    p.bottleneck if times else "none", messages, credit, p.burst_s, refill)


# ------------------------------------------------------------------ exact byte formulas

def chunk_sizes(numel: int, world: int) -> list[int]:
    """``comm.allreduce.chunk_bounds``' sizes: differ by at most one."""
    base, extra = divmod(numel, world)
    return [base + (1 if i < extra else 0) for i in range(world)]


def ring_bytes(numel: int, element_size: int, world: int, rank: int) -> int:
    """Bytes rank ``rank`` sends in one ring allreduce (``comm.allreduce.ring_bytes``)."""
    if world == 1:
        return 0
    sizes = chunk_sizes(numel, world)
    return (2 * numel - sizes[(rank + 1) % world] - sizes[(rank + 2) % world]) * element_size


def ring_bytes_max(numel: int, element_size: int, world: int) -> int:
    """The busiest rank's bytes: 2X(N-1)/N, rounded to whole elements (O(N))."""
    return max(ring_bytes(numel, element_size, world, r) for r in range(world))


# ------------------------------------------------------------------ allreduce algorithms

def ring(net: Network, devices: Sequence[int], nbytes: float) -> CommCost:
    """Ring allreduce (scatter-reduce + all-gather): 2(N-1) steps, each rank sends X/N to
    its right neighbour in every step."""
    n = len(devices)
    if n < 2 or nbytes <= 0:
        return NONE
    chunk = nbytes / n
    flows = [(devices[i], devices[(i + 1) % n], chunk) for i in range(n)]
    return _repeat(net.phase(flows), 2 * (n - 1), 2 * nbytes * (n - 1) / n, 2 * (n - 1))


def ring_groups(net: Network, groups: Sequence[Sequence[int]], nbytes: float) -> CommCost:
    """Rings over several groups of the same size at once (each stage's replicas of a
    hybrid, each tensor group): one phase holds every group's flows."""
    n = len(groups[0]) if groups else 0
    if n < 2 or nbytes <= 0:
        return NONE
    chunk = nbytes / n
    flows = [(g[i], g[(i + 1) % n], chunk) for g in groups for i in range(n)]
    return _repeat(net.phase(flows), 2 * (n - 1), 2 * nbytes * (n - 1) / n, 2 * (n - 1))


def tree(net: Network, devices: Sequence[int], nbytes: float) -> CommCost:
    """Recursive halving-doubling (Rabenseifner): log2(p) rounds of halving, then of
    doubling, partner at distance 1, 2, 4, ... (near ones first: the big messages stay
    inside a server). Ranks beyond the largest power of two p first hand their X to a partner
    and get the result back at the end (two extra phases)."""
    n = len(devices)
    if n < 2 or nbytes <= 0:
        return NONE
    p = 1 << (n.bit_length() - 1)
    total = NONE
    extra = [(devices[p + i], devices[i], nbytes) for i in range(n - p)]
    if extra:
        total = total + _repeat(net.phase(extra), 1, nbytes, 1)
    size, k, sent = nbytes, 1, 0.0
    rounds: list[CommCost] = []
    while k < p:
        size /= 2
        flows = [(devices[i], devices[i ^ k], size) for i in range(p)]
        ph = net.phase(flows)
        rounds.append(CommCost(ph.seconds, size, dict(ph.bytes_by_level), ph.bottleneck, 1))
        sent += size
        k <<= 1
    for r in rounds + rounds[::-1]:  # halving, then doubling in reverse order
        total = total + r
    if extra:
        back = [(d, s, b) for s, d, b in extra]
        total = total + _repeat(net.phase(back), 1, 0.0, 1)
    return CommCost(total.seconds, max(2 * sent, nbytes if extra else 0.0),
                    total.bytes_by_level, total.bottleneck, total.messages)


def _by_server(net: Network, devices: Sequence[int]) -> list[list[int]]:
    groups: dict[int, list[int]] = defaultdict(list)
    for d in devices:
        groups[net.server_of(d)].append(d)
    return list(groups.values())


def hierarchical(net: Network, devices: Sequence[int], nbytes: float) -> CommCost:
    """Reduce-scatter inside each server (ring over its g devices), a ring across servers
    for each of the g shards at once, all-gather inside each server (Horovod's / NCCL's
    hierarchical allreduce). Needs the same number of devices on every server."""
    groups = _by_server(net, devices)
    g, m = len(groups[0]), len(groups)
    if any(len(x) != g for x in groups):
        raise ConfigError("--allreduce hierarchical: every server must hold the same number "
                          "of workers")
    if len(devices) < 2 or nbytes <= 0:
        return NONE
    total = NONE
    if g > 1:
        flows = [(grp[i], grp[(i + 1) % g], nbytes / g) for grp in groups for i in range(g)]
        inner = _repeat(net.phase(flows), g - 1, nbytes * (g - 1) / g, g - 1)
        total = total + inner
    if m > 1:
        part = nbytes / g / m
        flows = [(groups[i][j], groups[(i + 1) % m][j], part) for j in range(g)
                 for i in range(m)]
        total = total + _repeat(net.phase(flows), 2 * (m - 1), 2 * (nbytes / g) * (m - 1) / m,
                                2 * (m - 1))
    if g > 1:
        total = total + inner
    return total


def main_node(net: Network, devices: Sequence[int], nbytes: float) -> CommCost:
    """The seeds' baseline: everyone sends X to rank 0, rank 0 sends the sum back to
    everyone. Rank 0 moves X(N-1) each way.

    Rank 0's sends of the sum do not always share its link fairly: where its link was
    calibrated with a fan-out (``Link.in_turn``: the share that went one peer after the
    other) the first worker has the sum before the last, at g = 1 - s + s / (N - 1) of the
    broadcast's time (s = 1: one after the other, 1 / (N - 1); s = 0: shared, 1), and its
    next tensor comes in while rank 0 still sends to the others: the next gather keeps
    rank 0's other direction busy from then on. An exchange costs the gather and g of the
    broadcast (at N = 3 one after the other: 3X/B a step, where fair sharing takes 4X/B)."""
    n = len(devices)
    if n < 2 or nbytes <= 0:
        return NONE
    root = devices[0]
    up = net.phase([(d, root, nbytes) for d in devices[1:]])
    down = net.phase([(root, d, nbytes) for d in devices[1:]])
    levels = defaultdict(float, up.bytes_by_level)
    for k, v in down.bytes_by_level.items():
        levels[k] += v
    worst = up if up.seconds >= down.seconds else down
    link = net.links.of(down.bottleneck) if down.bottleneck in LEVELS else net.links.nic
    s = link.in_turn(nbytes)
    first = 1 - s + s / (n - 1)  # of the broadcast, when the first worker has the sum
    # up and down use opposite directions (other token buckets): both start full
    seconds = up.seconds - up.credit_s + first * (down.seconds - down.credit_s)
    return CommCost(seconds, nbytes * (n - 1), dict(levels),
                    worst.bottleneck, n - 1, up.credit_s + down.credit_s)


ALLREDUCE = {"ring": ring, "tree": tree, "hierarchical": hierarchical, "main": main_node}


def allreduce(algorithm: str, net: Network, devices: Sequence[int], nbytes: float) -> CommCost:
    try:
        fn = ALLREDUCE[algorithm]
    except KeyError:
        raise ConfigError(f"--allreduce: unknown algorithm {algorithm!r} (choose from "
                          f"{', '.join(ALGORITHMS)})") from None
    return fn(net, devices, nbytes)


def all_gather_ring(net: Network, devices: Sequence[int], nbytes_each: float) -> CommCost:
    """Ring all-gather of ``nbytes_each`` from every rank (a sparse top-k exchange): N-1
    steps, each rank forwards one rank's block."""
    n = len(devices)
    if n < 2 or nbytes_each <= 0:
        return NONE
    flows = [(devices[i], devices[(i + 1) % n], nbytes_each) for i in range(n)]
    return _repeat(net.phase(flows), n - 1, nbytes_each * (n - 1), n - 1)


# ------------------------------------------------------------------ parameter server

def ps_exchange(net: Network, workers: Sequence[int], shards: Sequence[int],
                fractions: Sequence[float], push_bytes: float, pull_bytes: float, *,
                duplex: bool) -> tuple[CommCost, CommCost]:
    """Every worker pushes ``push_bytes * fraction[s]`` to shard s and pulls
    ``pull_bytes * fraction[s]`` back. Returns (push, pull). ``duplex``: pushes and pulls
    run at once (BytePS pipelines them across tensors): one phase, the push carries its
    time, the pull none; otherwise the pull follows the push (phalanx's worker). A
    worker's messages are its S pushes; the pull's pieces answer them.

    Flows between two servers are summed (the workers of one server share its NIC), and S
    identical dedicated shards (equal fractions, CPU-only machines) are computed as one
    machine with S NICs: the same loads on every resource, O(servers) flows, not O(N S)."""
    if len(shards) != len(fractions):
        raise ConfigError("parameter server: one fraction per shard")
    dedicated = all(s >= net.devices for s in shards)
    if dedicated and len(set(fractions)) == 1 and len(shards) > 1:
        one = net.with_extra(1, nic_scale=float(len(shards)))
        push, pull = ps_exchange(one, workers, [net.devices], [sum(fractions)], push_bytes,
                                 pull_bytes, duplex=duplex)
        return replace(push, messages=len(shards)), pull
    push: dict[tuple[int, int], float] = defaultdict(float)
    pull: dict[tuple[int, int], float] = defaultdict(float)
    rep: dict[int, int] = {}
    for w in workers:
        ws = net.server_of(w)
        rep.setdefault(ws, w)
        for s, f in zip(shards, fractions):
            # flows inside a server stay per device; across servers, per server pair
            src = w if net.server_of(s) == ws else rep[ws]
            push[src, s] += push_bytes * f
            pull[s, src] += pull_bytes * f
    push_flows = [(a, b, v) for (a, b), v in push.items()]
    pull_flows = [(a, b, v) for (a, b), v in pull.items()]
    per_worker_push = push_bytes * sum(f for s, f in zip(shards, fractions)
                                       if net.server_of(s) != net.server_of(workers[0]))
    if duplex:
        both = net.phase(push_flows + pull_flows)
        return (CommCost(both.seconds - both.credit_s, per_worker_push, both.bytes_by_level,
                         both.bottleneck, len(shards), both.credit_s),
                CommCost(0.0, 0.0, {}, "none", 0))
    a, b = net.phase(push_flows), net.phase(pull_flows)
    return (CommCost(a.seconds - a.credit_s, per_worker_push, a.bytes_by_level, a.bottleneck,
                     len(shards), a.credit_s),
            CommCost(b.seconds - b.credit_s, 0.0, b.bytes_by_level, b.bottleneck, 0,
                     b.credit_s))


def point_to_point(net: Network, pairs: Sequence[tuple[int, int]], nbytes: float) -> CommCost:
    """One message of ``nbytes`` on each (src, dst) pair at once (pipeline sends)."""
    if not pairs or nbytes <= 0:
        return NONE
    return _repeat(net.phase([(s, d, nbytes) for s, d in pairs]), 1, nbytes, 1)


def flows_bytes(flows: Sequence[Flow]) -> float:
    return sum(b for _, _, b in flows)
