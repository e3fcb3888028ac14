"""``phalanx scale bytes``: every strategy's bytes per step, predicted and counted by the
kernel on test hosts.

Bytes, unlike step times, do not depend on how busy the machine is: a protocol sends what
it sends. So this check runs on links that are not shaped, needs no calibration run and
fits nothing: each strategy x model x N is one held-out point.

* **Measured.** One torchrun group per world size on test hosts (network namespaces, one
  process per host, as the bandwidth study does: ``phalanx.experiments.hostgroup``). Each
  configuration runs twice, for ``short`` and ``long`` steps, with no evaluation but the
  last; the kernel's tx counter of every host is read around each run. The steady state's
  bytes per step are the difference over the extra steps, so start-up (the weights'
  broadcast, rendezvous) and the final evaluation, equal in both runs, drop out.
* **Predicted.** :func:`phalanx.scale.predict.predict` for the same model (its parameters
  and activation size read from the model phalanx builds, :mod:`phalanx.scale.profile`)
  and the same settings: the busiest worker's payload per step, times the wire's framing
  and ACK overhead (TCP/IP headers: +0.3%, the calibration's median,
  ``reports/experiments/scale/calibration.json``; the same for every point).

A point's error is predicted / measured - 1 for the busiest worker host (PS shards are
hosts of their own and are not workers).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from phalanx.errors import ConfigError
from phalanx.experiments.hostgroup import Plan, PlannedRun, run_plan
from phalanx.runtime.hosts import TestNetwork, unavailable
from phalanx.scale.network import Link, hosts_network
from phalanx.scale.predict import predict
from phalanx.scale.profile import cuts_of, layer_count, profile_model
from phalanx.scale.report import commit
from phalanx.scale.setting import Compression, Setting

# the wire's framing and the receiver's ACKs, per payload byte (calibration.json, 2026-11-28:
# wire overhead 0.11-0.17%, ACKs 0.05-0.16%: their medians' sum)
WIRE = 1.0025
# Each message a worker sends and the one that answers it, in bytes on the wire, from gloo's
# TCP transport (gloo/transport/tcp/pair.cc): a send of an unbound buffer (torch's
# isend / irecv, on which phalanx's rings, pipelines and PS run) first sends a
# NOTIFY_SEND_READY op, then the SEND_UNBOUND_BUFFER op with the payload; the receive sends
# a NOTIFY_RECV_READY op. Each op carries a 48-byte preamble (six size_t) and goes out in
# its own TCP segment, 66 bytes of Ethernet (14), IPv4 (20) and TCP (20 + 12 of timestamps)
# headers: 2 x (48 + 66) for the send, 48 + 66 for the receive. Counted, not fitted: the
# MLP's model parallel at N = 2 sends one activation and receives one gradient a step,
# 408 bytes over the payload measured, 82 of them its per-byte framing (WIRE).
FRAMING = 3 * (48 + 66)
# a segment sent again is a full frame: 1,448 bytes of payload (the MSS on a 1,500-byte MTU
# with timestamps) and 66 of headers; ``ss``'s bytes_retrans of gloo's connections
# matched 1,448 x RetransSegs to the byte in the runs of 2026-11-30
FRAME_OVER_MTU = 14
BATCH = 32
MODELS = {
    "mlp": ["--model", "mlp", "--data", "synthetic", "--train-limit", "4000"],
    "gpt": ["--model", "gpt", "--data", "shakespeare", "--context", "64", "--train-limit",
            "20000"],
    # the ctr-strategies study's table (26 fields x 32,768 rows of 16) and batch
    "ctr": ["--model", "ctr", "--data", "ctr-synthetic", "--ctr-rows", "32768",
            "--train-limit", "20000"],
}
INPUT = {"mlp": (1, 16, 16), "gpt": (64,), "ctr": None}  # what the data above feeds the model
OPTIONS = {"ctr": {"rows": 32768}}  # the model's own options, as the flags above set them
BATCHES = {"ctr": 256}  # else BATCH
PERIOD = 8  # averaging's steps between averages
SSP_BOUND = 3  # phalanx's default --staleness, stated in the runs and the prediction
GPT_HEADS = 4  # the GPT's default heads (4 blocks of width 128)


@dataclass(frozen=True)
class Case:
    """One strategy's configuration at N workers: its flags, how many processes (hosts) it
    starts, which ranks are workers, and the prediction's settings."""

    label: str
    flags: tuple[str, ...]
    world: int
    workers: tuple[int, ...]
    setting: dict[str, Any]


def _ps_cases(n: int) -> list[Case]:
    """BSP, ASP and SSP with 2 shards (ranks 0 and 1); SSP's bound stated on both sides."""
    out = []
    for s in ("bsp", "asp", "ssp"):
        flags = ("--strategy", s, "--servers", "2", "--rule", "sgd")
        setting: dict[str, Any] = {"strategy": s, "servers": 2}
        if s == "ssp":
            flags += ("--staleness", str(SSP_BOUND))
            setting["staleness"] = SSP_BOUND
        out.append(Case(s, flags, n + 2, tuple(range(2, n + 2)), setting))
    return out


def cases(n: int, model: str) -> list[Case]:
    """Every strategy phalanx can run across hosts with ``n`` workers (PS: 2 more hosts for
    the shards, ranks 0 and 1; pipeline and model parallel up to a stage a layer: the MLP
    to 6, the GPT to 7); for the CTR model, those that differ in how its table travels:
    densified in the buckets, its rows all-gathered, its rows pushed and pulled."""
    w = tuple(range(n))
    if model == "ctr":
        return [
            Case("sync ring", ("--strategy", "sync", "--allreduce", "ring"), n, w,
                 {"strategy": "sync", "allreduce": "ring"}),
            Case("sync sparse", ("--strategy", "sync", "--allreduce", "ring",
                                 "--sparse-allreduce"), n, w,
                 {"strategy": "sync", "allreduce": "ring", "sparse_allreduce": True}),
            Case(f"average k={PERIOD}", ("--strategy", "average", "--period", str(PERIOD)),
                 n, w, {"strategy": "average", "period": PERIOD}),
            *_ps_cases(n)]
    out = [
        Case("sync ring", ("--strategy", "sync", "--allreduce", "ring"), n, w,
             {"strategy": "sync", "allreduce": "ring"}),
        Case("sync main", ("--strategy", "sync", "--allreduce", "main"), n, w,
             {"strategy": "sync", "allreduce": "main"}),
        Case("sync top-k 1%", ("--strategy", "sync", "--allreduce", "ring", "--compress",
                               "topk:0.01"), n, w,
             {"strategy": "sync", "allreduce": "ring", "compress": "topk:0.01"}),
        Case(f"average k={PERIOD}", ("--strategy", "average", "--period", str(PERIOD)), n, w,
             {"strategy": "average", "period": PERIOD}),
        *_ps_cases(n),
        Case("zero-1", ("--strategy", "zero", "--zero-stage", "1", "--allreduce", "ring",
                        "--rule", "adamw"), n, w, {"strategy": "zero", "zero_stage": 1}),
        Case("zero-3", ("--strategy", "zero", "--zero-stage", "3", "--allreduce", "ring",
                        "--rule", "adamw"), n, w, {"strategy": "zero", "zero_stage": 3}),
    ]
    if n <= layer_count(model, INPUT[model]):  # a stage a worker: no more than its layers
        out += [
            Case("pipeline M=4", ("--strategy", "pipeline", "--stages", str(n),
                                  "--microbatches", "4"), n, w,
                 {"strategy": "pipeline", "micro_batches": 4}),
            Case("model-parallel", ("--strategy", "model-parallel", "--workers", str(n)), n,
                 w, {"strategy": "model-parallel"})]
    if model == "gpt" and GPT_HEADS % n == 0:  # tensor splits the heads over the ranks
        out.append(Case("tensor", ("--strategy", "tensor", "--workers", str(n)), n, w,
                        {"strategy": "tensor", "tensor": n}))
    if n % 2 == 0 and n >= 4:
        out.append(Case("hybrid 2 stages", ("--strategy", "hybrid", "--stages", "2",
                                            "--replicas", str(n // 2), "--microbatches", "2"),
                        n, w, {"strategy": "hybrid", "stages": 2, "micro_batches": 2}))
    return out


def _flags(case: Case, model: str, steps: int, out: Path, seed: int) -> list[str]:
    has_workers = "--workers" in case.flags or case.setting["strategy"] in (
        "pipeline", "hybrid")
    workers = [] if has_workers else ["--workers", str(len(case.workers))]
    return [*MODELS[model], "--batch-size", str(BATCHES.get(model, BATCH)),
            "--max-steps", str(steps),
            "--eval-every", str(10 * steps), "--seed", str(seed), "--threads", "1",
            "--test-limit", "64", "--no-progress", "--no-tensorboard", *case.flags, *workers,
            "--out", str(out)]


@dataclass(frozen=True)
class Point:
    model: str
    label: str
    n: int
    measured: float     # bytes per step the busiest worker host sent (kernel)
    predicted: float
    per_host: tuple[float, ...]
    # how it was made: the commit, ``phalanx train``'s flags (those of every run), and
    # the (short, long) steps whose difference is counted
    commit: str = ""
    flags: tuple[str, ...] = ()
    steps: tuple[int, int] = (0, 0)
    # the layers of each stage its runs cut the model into (model parallel, pipelines)
    partition: tuple[tuple[str, ...], ...] = ()
    # each host's bytes sent again a step (TCP's retransmissions), taken off per_host
    resent: tuple[float, ...] = ()

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1 if self.measured else float("inf")


def _netstats(run_dir: Path, world: int) -> list[dict[str, float]]:
    out = []
    for r in range(world):
        path = run_dir / f"netstats-rank{r}.json"
        try:
            got = json.loads(path.read_text())
            out.append({k: float(got.get(k, 0))
                        for k in ("tx_bytes", "retrans_segs", "tcp_timeouts", "mtu")})
        except (OSError, ValueError, TypeError, AttributeError):
            raise ConfigError(f"{path}: not a run's network counters") from None
    return out


def resent(stats: dict[str, float]) -> float:
    """Bytes a host put on the wire again: TCP's retransmissions (a loaded host's veth
    backlog drops segments now and then), each a full frame. They are the network's doing,
    not the protocol's, and are taken off its tx count."""
    return stats["retrans_segs"] * (stats["mtu"] + FRAME_OVER_MTU)


def _tx(run_dir: Path, world: int) -> list[float]:
    """Each host's tx bytes in a run, less what it sent again."""
    return [x["tx_bytes"] - resent(x) for x in _netstats(run_dir, world)]


def slug(label: str) -> str:
    """A case's label as it names its run folders ("sync top-k 1%" -> "sync_top-k_1pc")."""
    return label.replace(" ", "_").replace("%", "pc")


def partition_of(run_dir: Path) -> list[list[str]] | None:
    """The layers of each stage a model-parallel or pipeline run cut its model into (its
    summary's ``partition``), None for other strategies."""
    path = run_dir / "summary.json"
    try:
        got = json.loads(path.read_text()).get("partition")
    except (OSError, ValueError, AttributeError):
        raise ConfigError(f"{path}: not a run's summary") from None
    if got and not (isinstance(got, list) and all(isinstance(s, str) for s in got)):
        raise ConfigError(f"{path}: partition is not a list of stages") from None
    return [s.split(",") for s in got] if got else None


AGAIN = 2  # times a pair whose two runs cut the model differently is run again


def measure(out: Path, models: list[str], sizes: list[int], short: int, long: int,
            seed: int = 0, say=print) -> dict[tuple[str, str, int], list[float]]:
    """Per (model, case, N): each host's tx bytes per step over the extra steps.

    phalanx cuts a model into stages where rank 0's timing of its layers balances them
    (``parallel/partition.py``): where layers cost alike, two runs can cut differently
    (the MLP in three: after flatten and fc1 in one run, after fc1 and fc2 in the next),
    and the difference of such a pair is no steady state. Such a pair is run again, up to
    ``AGAIN`` times, and left out if it never agrees."""
    found: dict[tuple[str, str, int], list[float]] = {}
    for model in models:
        for n in sizes:
            by_world: dict[int, list[Case]] = {}
            for c in cases(n, model):
                by_world.setdefault(c.world, []).append(c)
            for world, group in sorted(by_world.items()):
                runs, index = [], []
                for c in group:
                    tag = f"{model}-n{n}-{slug(c.label)}"
                    for steps in (short, long):
                        d = out / "runs" / f"{tag}-{steps}"
                        runs.append(PlannedRun(_flags(c, model, steps, d, seed),
                                               netstats="eth0"))
                    index.append((c, out / "runs" / f"{tag}-{short}",
                                  out / "runs" / f"{tag}-{long}"))
                say(f"phalanx scale bytes: {model}, N={n}, {world} hosts: "
                    f"{', '.join(c.label for c in group)}")
                with TestNetwork(world) as net:
                    plan = Plan(runs, net.bridge_ns, net.ports())
                    run_plan(net, 1, plan, out / "groups" / f"{model}-n{n}-w{world}",
                             timeout_s=1800)
                for c, a, b in index:
                    for again in range(AGAIN + 1):
                        cut_a, cut_b = partition_of(a), partition_of(b)
                        if cut_a == cut_b:
                            ta, tb = _tx(a, world), _tx(b, world)
                            found[(model, c.label, n)] = [(y - x) / (long - short)
                                                          for x, y in zip(ta, tb)]
                            break
                        if again == AGAIN:
                            say(f"phalanx scale bytes: {model} {c.label} N={n}: its runs "
                                f"cut the model differently {AGAIN + 1} times; left out")
                            break
                        say(f"phalanx scale bytes: {model} {c.label} N={n}: its two runs "
                            f"cut the model differently ({cut_a} and {cut_b}); again")
                        with TestNetwork(world) as net:
                            pair = [PlannedRun(_flags(c, model, k, d, seed), netstats="eth0")
                                    for k, d in ((short, a), (long, b))]
                            run_plan(net, 1, Plan(pair, net.bridge_ns, net.ports()),
                                     out / "groups" / f"{model}-n{n}-w{world}-{slug(c.label)}"
                                     f"-again{again + 1}", timeout_s=1800)
    return found


def setting_of(c: Case, n: int) -> Setting:
    """The prediction's settings for case ``c`` at ``n`` workers."""
    kw = dict(c.setting)
    if "compress" in kw:
        kw["compress"] = Compression.parse(kw["compress"])
    return Setting(workers=n, **kw)


def payload_and_messages(c: Case, n: int, workload) -> tuple[float, float]:
    """The busiest worker's payload bytes and messages a step, as the model predicts them."""
    got = predict(workload, setting_of(c, n), hosts_network(n, Link(bandwidth=1e9 / 8)))
    return got.bytes_per_worker, got.messages


def predict_point(model: str, c: Case, n: int, workload) -> float:
    """The busiest worker's bytes on the wire a step: its payload with the per-byte framing
    (``WIRE``) and each message's own (``FRAMING``)."""
    payload, messages = payload_and_messages(c, n, workload)
    return payload * WIRE + messages * FRAMING


def with_cuts(workload, model: str, stages: Sequence[Sequence[str]] | None):
    """``workload`` with the cut a run made (its ``partition``), where it reports one."""
    if not stages or len(stages) < 2 or INPUT.get(model) is None:
        return workload
    at = len(stages) - 2
    cuts, params = list(workload.cut_bytes), list(workload.stage_params)
    cuts += [()] * (at + 1 - len(cuts))
    params += [()] * (at + 1 - len(params))
    cuts[at], params[at] = cuts_of(model, stages, INPUT[model], OPTIONS.get(model))
    return replace(workload, cut_bytes=tuple(cuts), stage_params=tuple(params))


def resent_per_step(out: Path, found: dict[tuple[str, str, int], list[float]],
                    short: int, long: int) -> dict[tuple[str, str, int], list[float]]:
    """Each point's hosts' bytes sent again a step (over the extra steps), from its runs'
    counters under ``out``."""
    got = {}
    for model, label, n in found:
        tag = out / "runs" / f"{model}-n{n}-{slug(label)}"
        world = len(found[model, label, n])
        a = _netstats(Path(f"{tag}-{short}"), world)
        b = _netstats(Path(f"{tag}-{long}"), world)
        got[model, label, n] = [(resent(y) - resent(x)) / (long - short) for x, y in zip(a, b)]
    return got


def points(found: dict[tuple[str, str, int], list[float]],
           steps: tuple[int, int] = (0, 0), seed: int = 0,
           partitions: dict[tuple[str, str, int], list[list[str]] | None] | None = None,
           resends: dict[tuple[str, str, int], list[float]] | None = None) -> list[Point]:
    """The points of ``found``, each predicted with the cut its runs made where
    ``partitions`` has it (else where phalanx's partition cuts the model here)."""
    loads = {m: profile_model(m, BATCHES.get(m, BATCH), repeats=1, input_shape=INPUT[m],
                              options=OPTIONS.get(m), data_seed=seed)
             for m in {k[0] for k in found}}
    made_by = commit()
    out = []
    for (model, label, n), per_host in sorted(found.items()):
        c = next(c for c in cases(n, model) if c.label == label)
        measured = max(per_host[r] for r in c.workers)
        w = with_cuts(loads[model], model, (partitions or {}).get((model, label, n)))
        cut = (partitions or {}).get((model, label, n))
        out.append(Point(model, label, n, measured, predict_point(model, c, n, w),
                         tuple(per_host), made_by, (*MODELS[model], *c.flags), steps,
                         tuple(tuple(stage) for stage in cut or ()),
                         tuple((resends or {}).get((model, label, n), ()))))
    return out


def _resent(p: Point) -> float | None:
    """The busiest worker's bytes sent again a step (taken off its count), None if the run
    did not count them."""
    if not p.resent:
        return None
    c = next(c for c in cases(p.n, p.model) if c.label == p.label)
    return p.resent[max(c.workers, key=lambda r: p.per_host[r])]


def table(pts: list[Point]) -> str:
    def again(p: Point) -> str:   # the busiest worker's retransmissions, taken off
        x = _resent(p)
        return "-" if x is None else f"{x / 1e3:.1f}"

    rows = ["| model | strategy | N | measured KB/step (busiest worker) | sent again "
            "(taken off) | predicted | error |", "|---|---|---|---|---|---|---|"]
    rows += [f"| {p.model} | {p.label} | {p.n} | {p.measured / 1e3:.1f} | {again(p)} | "
             f"{p.predicted / 1e3:.1f} | {p.error:+.1%} |" for p in pts]
    errs = [abs(p.error) for p in pts]
    within = sum(e <= 0.02 for e in errs)
    rows.append("")
    rows.append(f"{len(pts)} points: median |error| {statistics.median(errs):.1%}, worst "
                f"{max(errs):.1%}; {within} of {len(pts)} within 2%.")
    counted = [p for p in pts if _resent(p) is not None]
    if counted:  # what the retransmissions would have done, left on the count
        raw = [abs(p.predicted / (p.measured + _resent(p)) - 1) for p in counted]
        rows.append(f"With TCP's retransmissions left on the count: {len(counted)} points, "
                    f"median {statistics.median(raw):.1%}, worst {max(raw):.1%}; "
                    f"{sum(e <= 0.02 for e in raw)} within 2%.")
    return "\n".join(rows)


def load(path: Path) -> tuple[dict, dict, tuple[int, int], dict]:
    """An earlier ``bytes.json``'s measurements (each point's hosts' bytes), the cut each
    point's runs made (kept in it, else from the run folders beside it), its steps and the
    bytes its hosts sent again: to predict them again without running."""
    try:
        rows = json.loads(path.read_text())
        found = {(str(r["model"]), str(r["label"]), int(r["n"])):
                 [float(v) for v in r["per_host"]] for r in rows}
        steps = tuple(int(v) for v in rows[0]["steps"]) if rows else (0, 0)
        kept = {(str(r["model"]), str(r["label"]), int(r["n"])): r.get("partition")
                for r in rows}
        again = {(str(r["model"]), str(r["label"]), int(r["n"])):
                 [float(v) for v in r.get("resent", ())] for r in rows}
    except OSError as e:
        raise ConfigError(f"--reuse {path}: cannot read ({e.strerror})") from None
    except (ValueError, KeyError, TypeError, IndexError):
        raise ConfigError(f"--reuse {path}: not a bytes.json of 'phalanx scale bytes'") \
            from None
    for model, label, n in found:
        if model not in MODELS or label not in {c.label for c in cases(n, model)}:
            raise ConfigError(f"--reuse {path}: no case {label!r} of {model!r} at N = {n}")
    parts = {}
    for k in found:
        run_dir = path.parent / "runs" / f"{k[0]}-n{k[2]}-{slug(k[1])}-{steps[1]}"
        parts[k] = kept[k] or (partition_of(run_dir) if (run_dir / "summary.json").is_file()
                               else None)
    return found, parts, (steps[0], steps[1]), again


def run(out: Path, models: list[str], sizes: list[int], short: int = 4, long: int = 12,
        seed: int = 0, reuse: str | None = None) -> Path:
    for m in models:
        if m not in MODELS:
            raise ConfigError(f"--models: {m!r} is not one of {', '.join(MODELS)}")
    for n in sizes:
        if not 2 <= n <= 8:
            raise ConfigError(f"--sizes: {n} is not in 2..8")
    if not 1 <= short < long:
        raise ConfigError(f"--steps: {short},{long}: the short run must be shorter")
    if (long - short) % PERIOD:
        raise ConfigError(f"--steps: {short},{long}: the difference must be a multiple of "
                          f"{PERIOD} (averaging's period: it averages once every {PERIOD} "
                          f"steps)")
    if reuse:
        found, parts, (short, long), resends = load(Path(reuse))
    else:
        reason = unavailable()
        if reason is not None:
            raise ConfigError(f"scale bytes: needs test hosts (run as root): {reason}")
        out.mkdir(parents=True, exist_ok=True)
        found = measure(out, models, sizes, short, long, seed)
        parts = {k: partition_of(out / "runs" / f"{k[0]}-n{k[2]}-{slug(k[1])}-{long}")
                 for k in found}
        resends = resent_per_step(out, found, short, long)
    out.mkdir(parents=True, exist_ok=True)
    pts = points(found, (short, long), seed, parts, resends)
    (out / "bytes.json").write_text(json.dumps([asdict(p) for p in pts], indent=1))
    path = out / "bytes.md"
    path.write_text("# Bytes per step: predicted against the kernel's counters\n\n"
                    + table(pts) + "\n")
    return path
