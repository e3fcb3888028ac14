"""The analytical model: one step of a strategy on a network, from the workload layer, the
collectives of the system layer and the network layer's alpha-beta phases.

Placement: worker i runs on device i (workers packed server by server, as the scheduler's
pack policy places a gang). Parameter-server shards run on CPU-only machines of their own
(``dedicated``, BytePS's servers) or one on each of the first S workers' servers
(``colocated``, TensorFlow's usual set-up).

The asynchronous family gets a bound here (a worker's cycle alone, or the shards' capacity
for N workers, whichever is slower); the event simulation (:mod:`phalanx.scale.eventsim`)
gives its queueing and staleness.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from phalanx.errors import ConfigError
from phalanx.scale import collectives as C
from phalanx.scale.collectives import CommCost
from phalanx.scale.network import Network
from phalanx.scale.overlap import bucket_timeline
from phalanx.scale.setting import ASYNC, Prediction, Setting
from phalanx.scale.workload import Workload


def _check_fits(net: Network, n: int) -> None:
    if n > net.devices:
        raise ConfigError(f"--workers: {n} do not fit cluster {net.topology.name!r} "
                          f"({net.devices} devices)")


def _result(s: Setting, w: Workload, *, compute: float, exposed: float, comm: CommCost,
            server: float = 0.0, bubble: float = 0.0, straggler: float = 0.0,
            samples: float, staleness: float | None = None, notes: tuple[str, ...] = (),
            step: float | None = None) -> Prediction:
    step_s = step if step is not None else compute + exposed + server + bubble + straggler
    single = w.batch / w.step_compute_s
    rate = samples / step_s
    return Prediction(s.strategy, s.workers, step_s, compute, exposed, comm.seconds, server,
                      bubble, straggler, comm.bytes_per_worker, comm.bytes_by_level,
                      comm.bottleneck, samples, rate, rate / (s.workers * single), staleness,
                      notes, comm.messages)


def _grad_exchange(s: Setting, net: Network, devices: list[int], w: Workload
                   ) -> Callable[[float], CommCost]:
    """The sync strategies' exchange of ``bytes`` of gradient (compressed as set)."""
    comp = s.compress

    def exchange(nbytes: float) -> CommCost:
        if comp.topk:  # (index, value) pairs of the top fraction, gathered from everyone
            return C.all_gather_ring(net, devices, nbytes / w.element_size * comp.topk * 8)
        return C.allreduce(s.allreduce, net, devices, nbytes * comp.dense_scale)
    return exchange


def predict(w: Workload, s: Setting, net: Network) -> Prediction:
    """Predict one step of ``s`` for ``w`` on ``net``."""
    _check_fits(net, s.workers)
    try:
        fn = _STRATEGIES[s.strategy]
    except KeyError:
        raise ConfigError(f"--strategy: {s.strategy!r} has no model") from None
    return fn(w, s, net)


def _single(w: Workload, s: Setting, net: Network) -> Prediction:
    return _result(s, w, compute=w.step_compute_s, exposed=0.0, comm=C.NONE, samples=w.batch)


def _sync(w: Workload, s: Setting, net: Network) -> Prediction:
    devices = list(range(s.workers))
    rows = s.sparse_allreduce and w.sparse is not None
    bucketed = w.without_table() if rows else w
    exchange = _grad_exchange(s, net, devices, w)
    cap = int(s.bucket_mb * 1e6)

    def busy(nbytes: float) -> float:  # a bucket's exchange with no token-bucket credit
        c = exchange(nbytes)
        return c.seconds + c.credit_s

    tl = bucket_timeline(bucketed, cap, busy, cycle_s=s.fusion_cycle_ms / 1e3)
    whole = exchange(float(bucketed.grad_bytes))  # bytes and levels of one step's gradient
    # the links' token buckets (tc tbf's burst) refill only while the links are idle: in
    # the steady state, the compute the exchange does not overlap (at least the forward
    # pass). One step's credit is what the whole gradient's exchange would get, at most
    # that idle time (at 20 Mbit/s and 153 KB of burst: 64 ms against the MLP's 8 ms of
    # compute; a real step found 398 ms, 346 predicted with the full credit)
    hidden = tl.comm_s - tl.exposed_s
    idle = max(w.step_compute_s - hidden, w.step_compute_s * (1 - w.backward_fraction))
    if s.allreduce == "main" and not s.compress.topk:
        # gather, then broadcast: each direction also rests while the other one works
        # (the two phases take alike: half the exchange each)
        idle += tl.comm_s / 2
    credit = min(whole.credit_s, max(idle, 0.0))
    strag = w.step_compute_s * (s.stragglers.expected_max(s.workers) - 1)
    comm = CommCost(tl.comm_s - credit, whole.bytes_per_worker, whole.bytes_by_level,
                    whole.bottleneck, whole.messages * tl.buckets, credit_s=credit)
    fused = (f"{tl.buckets} buckets (a {s.fusion_cycle_ms:g} ms fusion cycle or "
             f"{s.bucket_mb:g} MB)" if s.fusion_cycle_ms else
             f"{tl.buckets} buckets of <= {s.bucket_mb:g} MB")
    notes = (f"{fused}; {s.allreduce} allreduce",)
    exposed = max(0.0, tl.exposed_s - credit)
    if rows:
        # --sparse-allreduce (sync_dp.sparse_mean): after backward, gloo all-gathers every
        # replica's distinct rows, int64 ids + values: nothing to overlap with
        table = C.all_gather_ring(net, devices, w.sparse.unique_rows(w.batch)
                                  * (w.sparse.dim * w.element_size + 8))
        # right after the buckets' exchange: its links have had no idle time to refill, and
        # it gets what the step's one refill left (the buckets take their bytes from it)
        left = max(0.0, min(max(whole.burst_s, table.burst_s), max(idle, 0.0)) - credit)
        saved = min(table.credit_s, left)
        table = CommCost(table.seconds + table.credit_s - saved, table.bytes_per_worker,
                         table.bytes_by_level, table.bottleneck, table.messages, saved)
        comm = comm + table
        exposed += table.seconds
        notes += ("the table's distinct rows all-gathered after backward (--sparse-allreduce)",)
    elif w.sparse is not None:
        notes += ("the embedding gradient travels densified (whole table), as phalanx's "
                  "buckets send it",)
    return _result(s, w, compute=w.step_compute_s, exposed=exposed, comm=comm,
                   straggler=strag, samples=w.batch * s.workers, notes=notes)


def _average(w: Workload, s: Setting, net: Network) -> Prediction:
    devices = list(range(s.workers))
    per = C.allreduce(s.allreduce, net, devices, w.grad_bytes * s.compress.dense_scale)
    # the links' token buckets refill only in the period's compute between two averages
    credit = min(per.credit_s, s.period * w.step_compute_s)
    per = CommCost(per.seconds + per.credit_s - credit, per.bytes_per_worker,
                   per.bytes_by_level, per.bottleneck, per.messages, credit, per.burst_s)
    comm = per.scaled(1.0 / s.period)
    strag = w.step_compute_s * (s.stragglers.expected_max(s.workers) - 1)
    return _result(s, w, compute=w.step_compute_s, exposed=comm.seconds, comm=comm,
                   straggler=strag, samples=w.batch * s.workers,
                   notes=(f"parameters averaged every {s.period} steps, after the step",))


def ps_layout(net: Network, s: Setting) -> tuple[Network, list[int]]:
    """The network with the shards' machines and the shards' device ids."""
    if s.server_placement == "dedicated":
        bigger = net.with_extra(s.servers)
        return bigger, [net.devices + i for i in range(s.servers)]
    servers = sorted({net.server_of(d) for d in range(s.workers)})
    if s.servers > len(servers):
        raise ConfigError(f"--servers: {s.servers} colocated shards need as many worker "
                          f"servers; the workers use {len(servers)}")
    first = {}
    for d in range(s.workers):
        first.setdefault(net.server_of(d), d)
    return net, [first[servers[i]] for i in range(s.servers)]


def ps_bytes(w: Workload, s: Setting) -> tuple[float, float]:
    """(push, pull) bytes per worker per exchange: the CTR table's rows travel sparse, the
    rest dense (compressed on the push). phalanx's worker (``ps/client.py``) pushes the
    distinct rows of its batch, int64 ids + values, and asks for the next batch's rows by
    their ids (worker to shard, counted with the push); the shards answer with the values."""
    dense = w.dense_params * w.element_size
    push = dense * s.compress.dense_scale
    if s.compress.topk:
        push = w.dense_params * s.compress.topk * 8
    pull = float(dense)
    if w.sparse is not None:
        rows = w.sparse.unique_rows(w.batch)
        values = rows * w.sparse.dim * w.element_size
        push, pull = push + values + rows * 8 * 2, pull + values
    return push, pull


def _ps_costs(w: Workload, s: Setting, net: Network, workers: list[int]
              ) -> tuple[CommCost, CommCost, float]:
    big, shards = ps_layout(net, s)
    push_b, pull_b = ps_bytes(w, s)
    frac = [1.0 / s.servers] * s.servers
    push, pull = C.ps_exchange(big, workers, shards, frac, push_b, pull_b, duplex=s.duplex)
    # a shard applies every worker's push one after another
    server = len(workers) * (s.server_msg_s + push_b / s.servers * s.server_byte_s)
    return push, pull, server


def _push_then_pull(push: CommCost, pull: CommCost, idle: float) -> float:
    """A worker's push, then its pull: the pull's answers leave a shard once its piece is
    in, but the S pieces share the worker's link and land together (a one-off probe on
    three test hosts: the first of two 1.6 MB pieces landed at 0.60-0.78 of the whole at
    20 and 100 Mbit/s), so little of the pull overlaps the push: none here.

    Each direction's token bucket refills while that direction rests, ``idle`` (the
    compute) plus the other direction's turn, so its credit is at most that."""
    a, b = push.seconds + push.credit_s, pull.seconds + pull.credit_s
    return (a - min(push.credit_s, idle + b)) + (b - min(pull.credit_s, idle + a))


def _bsp(w: Workload, s: Setting, net: Network) -> Prediction:
    workers = list(range(s.workers))
    push, pull, server = _ps_costs(w, s, net, workers)
    comm = push + pull
    exchange = push.seconds if s.duplex else _push_then_pull(push, pull, w.step_compute_s)
    strag = w.step_compute_s * (s.stragglers.expected_max(s.workers) - 1)
    notes = (f"{s.servers} shard(s), {s.server_placement}; push then pull"
             + (" (overlapped, duplex)" if s.duplex else ""),)
    return _result(s, w, compute=w.step_compute_s, exposed=exchange, comm=comm,
                   server=server, straggler=strag, samples=w.batch * s.workers, notes=notes)


def _async(w: Workload, s: Setting, net: Network) -> Prediction:
    """A worker's cycle: max(its cycle alone, the shards' time for N workers' exchanges);
    downpour pushes every npush and fetches every nfetch steps."""
    workers = list(range(s.workers))
    every_push = s.npush if s.strategy == "downpour" else 1
    every_pull = s.nfetch if s.strategy == "downpour" else 1
    compute = w.step_compute_s * s.stragglers.mean(s.workers)
    alone_push, alone_pull, _ = _ps_costs(w, s, net, workers[:1])
    push, pull, server = _ps_costs(w, s, net, workers)
    alone = compute + _push_then_pull(alone_push.scaled(1.0 / every_push),
                                      alone_pull.scaled(1.0 / every_pull), compute)
    # the shards' links: with N workers out of step, one worker's push comes in while
    # another's pull goes out (both directions at once, the duplex factor), busy back to
    # back (no idle time for the token buckets); the shard's CPU applies meanwhile
    big, shards = ps_layout(net, s)
    push_b, pull_b = ps_bytes(w, s)
    both, _ = C.ps_exchange(big, workers, shards, [1.0 / s.servers] * s.servers,
                            push_b / every_push, pull_b / every_pull, duplex=True)
    shared = max(both.seconds + both.credit_s, server / every_push)
    step = max(alone, shared)
    comm = push.scaled(1.0 / every_push) + pull.scaled(1.0 / every_pull)
    staleness = float(s.workers - 1)  # ASP's mean when pushes interleave evenly
    if s.strategy == "softsync":
        staleness = s.workers / s.softsync - 1 if s.softsync < s.workers else 0.0
    elif s.strategy == "ssp":
        staleness = min(staleness, float(s.staleness * s.workers))
    bound = "shards" if shared > alone else "worker"
    return _result(s, w, compute=compute, exposed=step - compute, comm=comm,
                   samples=w.batch * s.workers, staleness=max(staleness, 0.0), step=step,
                   server=0.0,
                   notes=(f"bound by the {bound}; staleness is the even-interleaving estimate:"
                          " run the event simulation (phalanx scale async) for its "
                          "distribution",))


def _hogwild(w: Workload, s: Setting, net: Network) -> Prediction:
    if net.server_of(s.workers - 1) != net.server_of(0):
        raise ConfigError(f"--workers: hogwild shares one machine's memory; {s.workers} "
                          f"workers span several servers")
    # every worker writes its update into the one shared copy (device 0's memory)
    comm = C.point_to_point(net, [(d, 0) for d in range(1, s.workers)], float(w.grad_bytes))
    return _result(s, w, compute=w.step_compute_s, exposed=comm.seconds, comm=comm,
                   samples=w.batch * s.workers, staleness=float(s.workers - 1),
                   notes=("lock-free writes to shared memory; staleness ~ N-1 (estimate)",))


def _pipeline_step(w: Workload, net: Network, devices: list[int], micro: int, batch: float
                   ) -> tuple[float, float, float, CommCost]:
    """(compute per stage, bubble, exposed send time, sends) of GPipe over ``devices`` as
    stages: M micro-batches forward, then backward. The critical path: the first
    micro-batch through every stage and link, P (f + b) + 2 sum_i s_i (f, b: a stage's
    forward and backward of one micro-batch; s_i: one send across cut i), then each later
    one behind the slower of a stage and the slowest link, (M - 1) (max(f, s) - f +
    max(b, s) - b) + M (f + b). The bubble is the compute idle in it, (P - 1)(f + b):
    (P - 1) / (M + P - 1) of the step when sends are free. (Model parallel, M = 1: the
    compute plus a send each way across every cut.) Each cut carries what phalanx's
    partition of the model puts there (``Workload.cuts``: the MLP's 3 stages send 1,024 and
    512 bytes a sample, not 1,024 at both; measured 50.0 KB a step at its busiest stage,
    65.7 predicted before 2026-11-30)."""
    p = len(devices)
    per_stage = w.step_compute_s * batch / w.batch / p
    f = per_stage / micro * (1 - w.backward_fraction)
    b = per_stage / micro * w.backward_fraction
    acts = [a * batch / micro for a in w.cuts(p)]
    pairs = [(devices[i], devices[i + 1]) for i in range(p - 1)]
    memo: dict[float, CommCost] = {}

    def together(nbytes: float) -> CommCost:
        """Every cut's link busy at once, each with ``nbytes`` (in the steady state a middle
        stage receives while it sends: its two directions share the NIC as calibrated);
        cached: a model cut into thousands of stages has a few distinct sizes."""
        if nbytes not in memo:
            memo[nbytes] = C.point_to_point(net, pairs, nbytes)
        return memo[nbytes]

    raw = [(x.seconds + x.credit_s) for x in (together(a) for a in acts)]
    top = max(raw, default=0.0)
    busy = (p - 1) * (f + b) + micro * (f + b) + 2 * sum(raw) + (micro - 1) * (
        max(f, top) - f + max(b, top) - b)

    def own(k: int) -> list[int]:   # the cuts stage k's NIC sends across: its activations
        return [i for i in (k, k - 1) if 0 <= i < p - 1]  # forward, their gradients back

    def sent(k: int) -> float:   # bytes per micro-batch stage k's NIC sends
        return sum(acts[i] for i in own(k))

    # a stage's NIC sends its activations forward and its gradients back: its token bucket
    # refills only while it rests. GPipe's sends come in two runs a step, the M forward
    # sends, then (after the later stages' work) the M backward ones: a middle stage's NIC
    # rests before each, and each run gets a bucket's credit, at most its share of the
    # NIC's idle time (the first and last stages send one run: all of it)
    saved = []
    for k in range(p):
        out_s = micro * sum(raw[i] for i in own(k))
        runs = [acts[i] for i in own(k) if acts[i] > 0]
        idle = max(0.0, busy - out_s) / max(len(runs), 1)
        credit = sum(min(together(micro * a).credit_s, idle) for a in runs)
        saved.append(credit / (micro * sent(k)) if sent(k) else 0.0)
    # a send takes at least its latency, whatever the bucket covers of its bytes
    one, two = (together(x) for x in (1.0, 2.0))
    latency = 2 * (one.seconds + one.credit_s) - (two.seconds + two.credit_s)
    s_f = [max(latency, raw[i] - saved[i] * acts[i]) if acts[i] > 0 else 0.0
           for i in range(p - 1)]                                     # stage i -> i + 1
    s_b = [max(latency, raw[i] - saved[i + 1] * acts[i]) if acts[i] > 0 else 0.0
           for i in range(p - 1)]                                     # stage i + 1 -> i
    bubble = (p - 1) * (f + b)
    exposed = sum(s_f) + sum(s_b) + (micro - 1) * (
        max(f, max(s_f, default=0.0)) - f + max(b, max(s_b, default=0.0)) - b)
    # no bucket outlasts a step that sends faster than the link's rate: a stage's NIC moves
    # its 2M sends' bytes at least at the rate, step after step (their latencies overlap
    # the link's work; the MLP's middle stage of three: 48 KB a step, 20.5 ms at 20 Mbit/s;
    # measured 20.4 ms, predicted 15.2 before)
    wire = [raw[i] + together(acts[i]).hidden_s - latency for i in range(p - 1)]
    floor = max(micro * sum(max(0.0, wire[i]) for i in own(k)) for k in range(p))
    exposed = max(exposed, floor - micro * (f + b) - bubble)
    levels: dict[str, float] = {}
    for i in range(p - 1):
        for k, v in C.point_to_point(net, [pairs[i]], acts[i]).bytes_by_level.items():
            levels[k] = levels.get(k, 0.0) + 2 * micro * v
    worst = max(range(p - 1), key=lambda i: raw[i], default=None)
    busiest = max(range(p), key=sent)  # its messages: one a micro-batch per run of sends
    sends = CommCost(micro * max((s_f[i] + s_b[i] for i in range(p - 1)), default=0.0),
                     micro * sent(busiest), levels,
                     together(acts[worst]).bottleneck if worst is not None else "none",
                     micro * sum(1 for i in own(busiest) if acts[i] > 0))
    return per_stage, bubble, exposed, sends


def _model_parallel(w: Workload, s: Setting, net: Network) -> Prediction:
    devices = list(range(s.workers))
    per_stage, bubble, send_s, sends = _pipeline_step(w, net, devices, 1, w.batch)
    return _result(s, w, compute=per_stage, exposed=send_s, comm=sends, bubble=bubble,
                   samples=w.batch, notes=("layers split over N stages, one batch in flight",))


def _pipeline(w: Workload, s: Setting, net: Network) -> Prediction:
    devices = list(range(s.workers))
    per_stage, bubble, send_s, sends = _pipeline_step(w, net, devices, s.micro_batches, w.batch)
    p, m = s.workers, s.micro_batches
    return _result(s, w, compute=per_stage, exposed=send_s, comm=sends, bubble=bubble,
                   samples=w.batch,
                   notes=(f"GPipe: bubble (P-1)/(M+P-1) = {(p - 1) / (m + p - 1):.3f} of the "
                          f"slots",))


def _hybrid(w: Workload, s: Setting, net: Network) -> Prediction:
    p = s.stages or min(4, s.workers)
    if s.workers % p:
        raise ConfigError(f"--stages: {p} does not divide --workers {s.workers}")
    r = s.workers // p
    per_stage, bubble, send_s, sends = _pipeline_step(w, net, list(range(p)),
                                                      s.micro_batches, w.batch)
    groups = [[rep * p + st for rep in range(r)] for st in range(p)]
    # each stage's replicas allreduce its gradient; the stage with most parameters (the
    # MLP's first holds 66% of them) is the busiest, all rings at once
    dp = C.ring_groups(net, groups, max(w.stage_grad_bytes(p)) * s.compress.dense_scale)
    comm = sends + dp
    return _result(s, w, compute=per_stage, exposed=send_s + dp.seconds, comm=comm,
                   bubble=bubble, samples=w.batch * r,
                   notes=(f"{p} stages x {r} replicas; each stage's gradient allreduced "
                          f"among its replicas after the pipeline",))


def _tensor(w: Workload, s: Setting, net: Network) -> Prediction:
    t, r = s.tensor, s.workers // s.tensor
    tp_groups = [list(range(i * t, (i + 1) * t)) for i in range(r)]
    act = w.activation_bytes * w.batch
    # Megatron: 2 allreduces of the activations per layer forward, 2 backward
    one = C.ring_groups(net, tp_groups, act)
    tp = one.scaled(4 * max(w.tp_layers, 1)) if t > 1 else C.NONE
    dp_groups = [[rep * t + i for rep in range(r)] for i in range(t)]
    dp = C.ring_groups(net, dp_groups, w.grad_bytes / t * s.compress.dense_scale)
    compute = w.step_compute_s / t
    exposed = tp.seconds + max(0.0, dp.seconds - compute * w.backward_fraction)
    return _result(s, w, compute=compute, exposed=exposed, comm=tp + dp, samples=w.batch * r,
                   notes=(f"tensor degree {t} x {r} replicas; {4 * max(w.tp_layers, 1)} "
                          f"activation allreduces per step on the critical path",))


def _sharded(w: Workload, s: Setting, net: Network) -> Prediction:
    """ZeRO / FSDP (phalanx/parallel/zero.py, fsdp.py): a reduce-scatter and an all-gather
    each cost half of the ring allreduce of the same bytes. Stage 1 reduces after backward;
    stage 2 reduce-scatters bucket by bucket in backward (the bucket timeline) and gathers
    the weights after the step; stage 3 (and FSDP2) also gathers every unit's weights
    before its forward and again before its backward: 1.5x the bytes. phalanx's stage 3
    gathers on the critical path (no prefetch), unit by unit where the workload knows
    phalanx's units (:func:`_stage3_units`: each collective's token-bucket credit is what
    the compute before it refilled); FSDP2 prefetches the next unit's gather
    during compute: forward's gathers hide behind forward, backward's gathers and
    reduce-scatters behind backward as sync's buckets do."""
    devices = list(range(s.workers))
    stage = 3 if s.strategy == "fsdp" else s.zero_stage
    half = C.allreduce(s.allreduce, net, devices, float(w.grad_bytes)).scaled(0.5)
    strag = w.step_compute_s * (s.stragglers.expected_max(s.workers) - 1)
    cap = int(s.bucket_mb * 1e6)

    def behind_backward(halves: int) -> float:
        """What ``halves`` half-allreduces per bucket leave exposed, started as backward
        finishes each bucket (sync's bucket timeline)."""
        return bucket_timeline(w, cap, lambda b: C.allreduce(
            s.allreduce, net, devices, float(b)).seconds * halves / 2).exposed_s

    # a link's token bucket refills only in the gaps its collectives leave: one bucket (at
    # most a collective's own time) per gap, and no more than the gap
    raw = half.seconds + half.credit_s
    bucket = min(C.allreduce(s.allreduce, net, devices, float(w.grad_bytes)).credit_s, raw)
    forward = w.step_compute_s * (1.0 - w.backward_fraction)
    if stage == 1:  # reduce-scatter and all-gather back to back after backward
        comm = half.scaled(2.0)
        exposed = 2 * raw - min(bucket, w.step_compute_s)
    elif stage == 2:
        comm, exposed = half.scaled(2.0), behind_backward(1) + half.seconds
    else:
        comm = half.scaled(3.0)
        units = w.units()
        if units:  # phalanx's units, one collective after another (the compute between)
            exposed = _stage3_units(units, w, lambda b: _half(s, net, devices, b), bucket)
        else:  # gather, forward, gather, backward, reduce-scatter: two gaps
            exposed = 3 * raw - min(bucket, forward) - min(bucket, w.step_compute_s - forward)
        if s.strategy == "fsdp":  # forward's gathers behind forward; backward's as sync's
            exposed = max(0.0, half.seconds - forward) + behind_backward(2)
    units = w.units()
    if units:  # phalanx's collectives go unit by unit, each with its own messages: a
        # unit's reduce-scatter and all-gather (stage 3: two gathers), the root's two
        ops = sum(2 if name == "root" or stage < 3 else 3 for name, _, _ in units)
        comm = replace(comm, messages=ops * _half(s, net, devices, 1.0).messages)
    what = "reduce-scatter + all-gather" if stage < 3 else "two all-gathers + a reduce-scatter"
    notes = (f"stage {stage}: {what} ({s.allreduce}), "
             f"{comm.bytes_per_worker / max(w.grad_bytes, 1):.2f} x the gradient's bytes",)
    return _result(s, w, compute=w.step_compute_s, exposed=exposed, comm=comm,
                   straggler=strag, samples=w.batch * s.workers, notes=notes)


def _half(s: Setting, net: Network, devices: list[int], nbytes: float) -> CommCost:
    """One reduce-scatter or all-gather of ``nbytes``: on a ring N - 1 steps of 1/N of it
    (a token bucket covers a step), else half the allreduce."""
    if s.allreduce == "ring":
        return C.all_gather_ring(net, devices, nbytes / s.workers)
    return C.allreduce(s.allreduce, net, devices, nbytes).scaled(0.5)


def _stage3_units(units: list[tuple[str, int, float]], w: Workload,
                  half: Callable[[float], CommCost], bucket_s: float) -> float:
    """Exposed seconds of phalanx's stage 3 (``parallel/zero.py``), on the critical path
    unit by unit: the root's gather, then each unit's gather before its forward; in
    backward, last unit first, its gather again, its backward, its reduce-scatter; the
    root's reduce-scatter last. A collective's token-bucket credit is what the compute
    since the last collective refilled (at most ``bucket_s``, and at most its own)."""
    total = sum(share for _, _, share in units) or 1.0
    fwd = w.step_compute_s * (1.0 - w.backward_fraction) / total
    bwd = w.step_compute_s * w.backward_fraction / total
    root = [(b, share) for name, b, share in units if name == "root"]
    mods = [(b, share) for name, b, share in units if name != "root"]
    ops: list[tuple[float, float]] = [(0.0, b) for b, _ in root]  # (compute before, bytes)
    gap = 0.0
    for b, share in mods:
        ops.append((gap, b))
        gap = fwd * share
    for b, share in reversed(mods):
        ops += [(gap, b), (bwd * share, b)]  # gather again; reduce-scatter after backward
        gap = 0.0
    ops += [(gap, b) for b, _ in root]
    tokens = exposed = 0.0
    for gap, b in ops:
        c = half(b)
        tokens = min(bucket_s, tokens + gap)
        used = min(tokens, c.credit_s)
        tokens -= used
        exposed += c.seconds + c.credit_s - used
    return exposed


_STRATEGIES: dict[str, Callable[[Workload, Setting, Network], Prediction]] = {
    "single": _single, "sync": _sync, "average": _average, "bsp": _bsp,
    "sandblaster": _bsp, "hogwild": _hogwild, "model-parallel": _model_parallel,
    "pipeline": _pipeline, "hybrid": _hybrid, "tensor": _tensor,
    "zero": _sharded, "fsdp": _sharded,
    **{name: _async for name in ASYNC},
}
