"""``phalanx scale steps``: every strategy's step time on shaped links, predicted and
measured, for the MLP, the GPT and the CTR model.

The bandwidth study (``phalanx scale validate``) holds four strategies of the MLP out; this
check runs every case of ``phalanx scale bytes`` (:func:`phalanx.scale.wire_check.cases`)
on test hosts, one process per host, each torchrun group re-shaping its links between runs
(``phalanx.experiments.hostgroup``):

* **fit** (one number per model and strategy): the runs at N = 2 on 1000 Mbit/s
  (``--fit-repeats``, spread over the group: first, between the other rates, last; their
  median) give the step's compute and per-step overhead c, the value that makes the
  prediction equal the measurement there (bisection: the step grows with c);
* **held out**: every other (N, rate): the prediction with that c (and at least the
  workers' compute over the cores, when they are more than the cores), the links as
  calibrated (``--calibration``: alpha, efficiency, token bucket and duplex at the nearest
  calibrated rate), nothing fitted to the point.

The parameter server's points (BSP, ASP, SSP) are predicted by the event simulation
(:mod:`phalanx.scale.eventsim`), the rest by :func:`phalanx.scale.predict.predict`. A
shard's answers leave one after another there, so the first worker answered computes and
pushes again while the shard still answers the others: BSP at N = 3 on the MLP ran 51 ms a
step at 100 Mbit/s (fourth rerun, 2026-11-29), the fluid model's two phases (every push,
then every answer) gave 71 and the simulation 54. Chosen with that rerun in view; the
figures in docs/scale.md come from a rerun after the change.

A run's step time is its steady-state samples/s (``summary.json``) over the samples a step
takes (``train_samples / steps``: a batch per replica). Each run is sized to last about
``--run-s`` seconds of steps (at least ``--steps``), by the model's guess of its step from
the compute profiled here and the calibrated link: the MLP's steps take 3-40 ms, and 20 of
them timed a tenth of a second, where one stall of the shared cores moved a point by a
third. Averaging's runs are a whole number of its periods: it also averages at a run's last
step, so 12 steps at period 8 held two averages where the steady state has 1.5. Step
times depend on how busy the machine is; the bandwidth-bound points (100 and 20 Mbit/s)
much less than 1000 Mbit/s.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from phalanx.errors import ConfigError
from phalanx.experiments.hostgroup import Plan, PlannedRun, run_plan
from phalanx.runtime.hosts import (
    TestNetwork,
    congestion_control,
    congestion_controls,
    unavailable,
)
from phalanx.scale import calibrate as cal
from phalanx.scale import wire_check as wc
from phalanx.scale.eventsim import AsyncSpec, simulate
from phalanx.scale.network import Link, hosts_network
from phalanx.scale.predict import predict, ps_bytes
from phalanx.scale.profile import profile_model
from phalanx.scale.report import commit

FIT = (2, 1000.0)  # (N, Mbit/s) each strategy's compute is fitted on
# the CTR table for step times: 26 x 4,096 rows (6.8 MB), so that sync's densified table
# takes seconds, not a minute, a step at 20 Mbit/s
STEP_MODELS = {**wc.MODELS, "ctr": ["--model", "ctr", "--data", "ctr-synthetic",
                                    "--ctr-rows", "4096", "--train-limit", "20000"]}
STEP_OPTIONS = {"ctr": {"rows": 4096}}
MAX_RUN_STEPS = 2000


@dataclass(frozen=True)
class Point:
    model: str
    label: str
    n: int
    rate: float
    measured_s: float
    predicted_s: float
    held_out: bool
    commit: str = ""
    runs_s: tuple[float, ...] = ()  # every run's step (a fit point's repeats)
    link_share: float = 0.0  # of the predicted step, the exposed communication
    run_steps: tuple[int, ...] = ()  # every run's steps (runs are sized: --run-s)
    # the layers of each stage its runs cut the model into (model parallel, pipelines:
    # phalanx's partition by measured time; the most common of its runs' cuts)
    partition: tuple[tuple[str, ...], ...] = ()
    # TCP segments every host of each run sent again (the kernel's RetransSegs, summed: a
    # loaded host's veth drops a burst's tail; most come back by fast retransmit, at little
    # cost); () where the runs did not count them
    resent: tuple[int, ...] = ()
    # of them, retransmission timeouts (TcpExt TCPTimeouts): each a sender idle >= 200 ms
    timeouts: tuple[int, ...] = ()
    # the TCP congestion control the runs ran under ("": not recorded; runs before
    # 2026-11-30 ran this machine's default, BBR)
    tcp: str = ""

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1


def _flags(case: wc.Case, model: str, steps: int, out: Path, seed: int) -> list[str]:
    flags = wc._flags(case, model, steps, out, seed)
    n = len(wc.MODELS[model])
    # --max-steps decides, not an epoch of the limited training set (the MLP's 4,000
    # samples are 62 steps at N = 2)
    return [*STEP_MODELS[model], *flags[n:], "--epochs", "10000"]


def _step_s(run_dir: Path, steps_of: list[int] | None = None) -> float:
    """The run's steady step seconds (its steps appended to ``steps_of``)."""
    s = json.loads((run_dir / "summary.json").read_text())
    if not s.get("samples_per_s") or not s.get("steps"):
        raise ConfigError(f"{run_dir}: the run measured no steady state")
    if steps_of is not None:
        steps_of.append(int(s["steps"]))
    return s["train_samples"] / s["steps"] / s["samples_per_s"]


def _resent(run_dir: Path, world: int) -> tuple[int, int]:
    """TCP segments the run's hosts sent again and the retransmission timeouts they took
    (their netstats, summed over the ranks; a file from before timeouts were counted: 0)."""
    stats = wc._netstats(run_dir, world)
    return (int(sum(x["retrans_segs"] for x in stats)),
            int(sum(x["tcp_timeouts"] for x in stats)))


def run_steps(c: wc.Case, guess_s: float, steps: int, run_s: float) -> int:
    """Steps for one run of ``c``: about ``run_s`` seconds at the guessed step, at least
    ``steps``, at most MAX_RUN_STEPS, and a whole number of averaging's periods."""
    k = max(steps, min(MAX_RUN_STEPS, math.ceil(run_s / max(guess_s, 1e-4))))
    period = int(c.setting.get("period") or 1)
    return -(-k // period) * period


def _loads(models, seed: int) -> dict[str, Any]:
    """Each model's workload, its compute profiled here."""
    return {m: profile_model(m, wc.BATCHES.get(m, wc.BATCH), repeats=1,
                             input_shape=wc.INPUT[m],
                             options=STEP_OPTIONS.get(m, wc.OPTIONS.get(m)), data_seed=seed)
            for m in models}


def _order(rates: list[float], n: int, repeats: int) -> list[float]:
    """The group's rates in run order: at N = 2 the fit rate ``repeats`` times, first,
    between the held-out rates and last (a fit run early in a group had run slow). At other
    N every rate of ``rates`` is held out, the fit rate too (its compute noise, reported)."""
    if n != FIT[0]:
        return list(rates)
    held = [r for r in rates if r != FIT[1]]
    slots = [[] for _ in range(len(held) + 1)]
    for i in range(repeats):
        slots[round(i * len(held) / max(repeats - 1, 1))].append(FIT[1])
    out = []
    for i, slot in enumerate(slots):
        out += slot + ([held[i]] if i < len(held) else [])
    return out


def measure(out: Path, models: list[str], sizes: list[int], rates: list[float], steps: int,
            seed: int = 0, say=print, fit_repeats: int = 1, run_s: float = 0.0,
            fitted: dict[str, Any] | None = None, cores: int = 1,
            steps_of: dict | None = None, loads: dict[str, Any] | None = None,
            parts_of: dict | None = None, resent_of: dict | None = None,
            strategies: list[str] | None = None, tcp: str = ""
            ) -> dict[tuple[str, str, int, float], list[float]]:
    """(model, case, N, rate) -> every run's measured step seconds (and into ``steps_of``,
    its steps; into ``parts_of``, the cut each run made where it reports one; into
    ``resent_of``, the TCP segments its hosts sent again). With
    ``run_s`` (and the calibration ``fitted``), each run's steps are sized by
    :func:`run_steps` from the models' profiled ``loads`` (:func:`_loads`)."""
    found: dict[tuple[str, str, int, float], list[float]] = {}
    if run_s and loads is None:
        loads = _loads(models, seed)
    for model in models:
        for n in sizes:
            at = _order(rates, n, fit_repeats)
            by_world: dict[int, list[wc.Case]] = {}
            for c in wc.cases(n, model):
                if strategies is None or c.label in strategies:
                    by_world.setdefault(c.world, []).append(c)
            for world, group in sorted(by_world.items()):
                runs, index = [], []
                for i, rate in enumerate(at):
                    for c in group:
                        tag = (f"{model}-n{n}-{int(rate)}-"
                               f"{wc.slug(c.label)}"
                               + (f"-{at[:i].count(rate)}" if at.count(rate) > 1 else ""))
                        d = out / "runs" / tag
                        k = steps
                        if run_s:
                            w = loads[model]
                            k = run_steps(c, _predict(model, c, n, cal.link_for(fitted, rate),
                                                      w, w.step_compute_s, cores),
                                          steps, run_s)
                        runs.append(PlannedRun(_flags(c, model, k, d, seed),
                                               rate_mbit=rate, netstats="eth0"))
                        index.append((c, rate, d))
                say(f"phalanx scale steps: {model}, N={n}, {world} hosts, "
                    f"{', '.join(f'{r:g}' for r in at)} Mbit/s: "
                    f"{', '.join(c.label for c in group)}")
                with TestNetwork(world, tcp=tcp) as net:
                    run_plan(net, 1, Plan(runs, net.bridge_ns, net.ports()),
                             out / "groups" / f"{model}-n{n}-w{world}", timeout_s=3600)
                for c, rate, d in index:
                    key = (model, c.label, n, rate)
                    found.setdefault(key, []).append(
                        _step_s(d, None if steps_of is None else steps_of.setdefault(key, [])))
                    if resent_of is not None:
                        resent_of.setdefault(key, []).append(list(_resent(d, c.world)))
                    cut = wc.partition_of(d) if parts_of is not None else None
                    if cut:
                        parts_of.setdefault(key, []).append(cut)
    return found


def _cut(parts: list | None) -> tuple[tuple[str, ...], ...]:
    """The most common of a point's runs' cuts (the first of equals)."""
    if not parts:
        return ()
    cuts = [tuple(tuple(stage) for stage in p) for p in parts]
    return max(cuts, key=cuts.count)


def _predict(model: str, c: wc.Case, n: int, link: Link, workload, compute: float,
             cores: int) -> float:
    return _predicted(model, c, n, link, workload, compute, cores)[0]


def _predicted(model: str, c: wc.Case, n: int, link: Link, workload, compute: float,
               cores: int) -> tuple[float, float]:
    """(step seconds, the share of it the prediction spends on exposed communication):
    the step with ``compute`` seconds of compute (one worker's, on a core of its own), and
    at least what the cores allow. The workers' processes share ``cores`` (the shards'
    mostly wait on their links): where every worker computes the same phase at once
    (data parallel, ZeRO, tensor parallel: ``TOGETHER``) a worker's compute takes
    ``compute`` x max(1, workers / cores), as the kernel time-slices them; the parameter
    server's event simulation shares the cores between the workers computing at each
    moment (a worker that waits on its link leaves its core to the others); pipeline and
    model-parallel stages are left one core each (an ordering the stages' sends decide,
    not modelled). In any case a step takes no less than the workers' compute over the
    cores."""
    s = wc.setting_of(c, n)
    workers = len(c.workers)
    shared = compute * max(1.0, workers / cores) if cores and s.strategy in TOGETHER \
        else compute
    w = workload.with_compute(shared, "fitted")
    p = predict(w, s, hosts_network(n, link))
    step, exposed = p.step_s, p.exposed_comm_s
    if s.strategy in SIMULATED:
        step = _simulated(w, s, link, cores)
        exposed = max(0.0, step - p.compute_s)
    # (p.compute_s is a stage's compute in a pipeline: the floor is the unshared one's)
    step = max(step, p.compute_s * compute / shared * workers / cores) if cores else step
    return step, min(1.0, exposed / step)


SIMULATED = ("bsp", "asp", "ssp")  # the parameter server's: the event simulation's step
SIM_STEPS = 200  # per worker; the first few (full token buckets) weigh 1/50 or less
# strategies whose workers all compute at the same time, each the same work
TOGETHER = ("sync", "average", "zero", "tensor")


def _simulated(w, s, link: Link, cores: int = 0) -> float:
    """The event simulation's mean step of a PS setting on test hosts (every worker and
    shard its own host, all links ``link``; the workers on ``cores`` cores, 0: one each)."""
    push, pull = ps_bytes(w, s)
    return simulate(AsyncSpec(
        workers=s.workers, shards=s.servers, steps=SIM_STEPS, compute_s=w.step_compute_s,
        push_bytes=push, pull_bytes=pull, worker_bw=link.bandwidth, shard_bw=link.bandwidth,
        latency_s=link.latency, burst_bytes=link.burst, duplex=link.duplex,
        server_msg_s=s.server_msg_s, server_byte_s=s.server_byte_s, consistency=s.strategy,
        bound=s.staleness if s.strategy == "ssp" else 0, stragglers=s.stragglers,
        cores=cores)).step_s


def _fit(model: str, c: wc.Case, link: Link, workload, measured: float, cores: int) -> float:
    lo, hi = 1e-5, 30.0
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        over = _predict(model, c, FIT[0], link, workload, mid, cores) > measured
        lo, hi = (lo, mid) if over else (mid, hi)
    return (lo * hi) ** 0.5


def points(found: dict[tuple[str, str, int, float], float | list[float]],
           fitted: dict[str, Any], cores: int, seed: int = 0,
           steps_of: dict | None = None, loads: dict[str, Any] | None = None,
           parts_of: dict | None = None, resent_of: dict | None = None,
           tcp: str = "") -> list[Point]:
    """The fit and held-out points of ``found``'s measurements (a list: several runs of
    one point, their median taken; ``steps_of``: each run's steps, kept with it;
    ``loads``: the models' profiled workloads, profiled here if not given; ``parts_of``:
    the cuts its runs made, each point predicted with its own, else where phalanx's
    partition cuts the model here)."""
    runs = {k: tuple(v) if isinstance(v, list) else (v,) for k, v in found.items()}
    found = {k: statistics.median(v) for k, v in runs.items()}
    loads = loads or _loads({k[0] for k in found}, seed)
    made_by = commit()
    compute: dict[tuple[str, str], float] = {}
    for (model, label, n, rate), step in found.items():
        if (n, rate) == FIT:
            c = next(c for c in wc.cases(n, model) if c.label == label)
            cut = _cut((parts_of or {}).get((model, label, n, rate)))
            compute[model, label] = _fit(model, c, cal.link_for(fitted, rate),
                                         wc.with_cuts(loads[model], model, cut), step, cores)
    out = []
    for (model, label, n, rate), step in sorted(found.items()):
        if (model, label) not in compute:
            continue  # no fit point for this case (its N=2 run is missing)
        c = next(c for c in wc.cases(n, model) if c.label == label)
        cut = _cut((parts_of or {}).get((model, label, n, rate)))
        pred, share = _predicted(model, c, n, cal.link_for(fitted, rate),
                                 wc.with_cuts(loads[model], model, cut),
                                 compute[model, label], cores)
        out.append(Point(model, label, n, rate, step, pred, (n, rate) != FIT, made_by,
                         runs[model, label, n, rate], share,
                         tuple((steps_of or {}).get((model, label, n, rate), ())), cut,
                         *_lost((resent_of or {}).get((model, label, n, rate), ())), tcp))
    return out


def _lost(runs) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Each run's (segments resent, timeouts) as the Point's two tuples."""
    return tuple(int(r[0]) for r in runs), tuple(int(r[1]) for r in runs)


def table(pts: list[Point]) -> str:
    def ms(v: float) -> str:
        return f"{v * 1e3:.1f}" if v < 0.1 else f"{v * 1e3:.0f}"

    rows = ["| model | strategy | N | Mbit/s | steps a run | measured step (ms) | predicted | "
            "error | link share | TCP resent (timeouts) | set |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    rows += [f"| {p.model} | {p.label} | {p.n} | {p.rate:g} | "
             f"{'/'.join(str(k) for k in sorted(set(p.run_steps))) or '-'} | "
             f"{ms(p.measured_s)}"
             + (f" ({'/'.join(ms(r) for r in p.runs_s)})" if len(p.runs_s) > 1 else "")
             + f" | {ms(p.predicted_s)} | {p.error:+.1%} | {p.link_share:.0%} | "
             f"{'/'.join(f'{k} ({t})' for k, t in zip(p.resent, p.timeouts)) or '-'} | "
             f"{'held out' if p.held_out else 'fit'} |"
             for p in sorted(pts, key=lambda p: (p.model, p.label, -p.rate, p.n))]
    rows += ["", "| held-out points | n | median abs error | worst |", "|---|---|---|---|"]
    held = [p for p in pts if p.held_out]
    slow = [p for p in held if p.rate <= 100]
    groups = {"20 + 100 Mbit/s (the issue's bandwidth-bound rates)": slow,
              "of them, link-bound (predicted: exposed communication >= half the step)":
              [p for p in slow if p.link_share >= 0.5],
              "of them, the rest (compute, latency, small messages)":
              [p for p in slow if p.link_share < 0.5],
              "of them, runs without a TCP retransmission timeout":
              [p for p in slow if p.timeouts and not any(p.timeouts)],
              "of them, runs that waited for one (>= 200 ms each)":
              [p for p in slow if any(p.timeouts)],
              "1000 Mbit/s": [p for p in held if p.rate > 100]}
    for m in sorted({p.model for p in pts}):
        groups[f"{m}, 20 + 100 Mbit/s"] = [p for p in held if p.model == m and p.rate <= 100]
    for name, ps in groups.items():
        if ps:
            e = [abs(p.error) for p in ps]
            rows.append(f"| {name} | {len(ps)} | {statistics.median(e):.1%} | "
                        f"{max(e):.1%} |")
    return "\n".join(rows)


def load_found(path: Path) -> dict[tuple[str, str, int, float], list[float]]:
    """The measured step times of an earlier run's ``steps.json`` (to predict them again,
    e.g. from another calibration, without running): every run of a point where they were
    kept, else its one figure."""
    try:
        rows = json.loads(path.read_text())
        return {(str(r["model"]), str(r["label"]), int(r["n"]), float(r["rate"])):
                [float(v) for v in r.get("runs_s") or [r["measured_s"]]] for r in rows}
    except OSError as e:
        raise ConfigError(f"--reuse {path}: cannot read ({e.strerror})") from None
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"--reuse {path}: not a steps.json of 'phalanx scale steps'") \
            from None


def load_tcp(path: Path) -> str:
    """The congestion control an earlier ``steps.json``'s runs ran under ("": unrecorded)."""
    return next((str(r["tcp"]) for r in json.loads(path.read_text()) if r.get("tcp")), "")


def load_resent(path: Path) -> dict[tuple[str, str, int, float], list[list[int]]]:
    """Each run's (TCP segments sent again, retransmission timeouts) of an earlier
    ``steps.json``, where it counted them."""
    rows = json.loads(path.read_text())
    return {(str(r["model"]), str(r["label"]), int(r["n"]), float(r["rate"])):
            [[int(k), int(t)] for k, t in zip(r["resent"], r.get("timeouts") or
                                              [0] * len(r["resent"]))]
            for r in rows if r.get("resent")}


def load_parts(path: Path) -> dict[tuple[str, str, int, float], list]:
    """The cuts an earlier run's points were made with: as its ``steps.json`` kept them,
    else from its run folders beside it (``runs/``) where they are still there."""
    rows = json.loads(path.read_text())
    out: dict[tuple[str, str, int, float], list] = {}
    for r in rows:
        key = (str(r["model"]), str(r["label"]), int(r["n"]), float(r["rate"]))
        if r.get("partition"):
            out[key] = [r["partition"]]
            continue
        tag = f"{key[0]}-n{key[2]}-{int(key[3])}-{wc.slug(key[1])}"
        runs = [d for d in sorted((path.parent / "runs").glob(tag + "*"))
                if d.name == tag or d.name[len(tag):].lstrip("-").isdigit()]
        got = [p for p in (wc.partition_of(d) for d in runs
                           if (d / "summary.json").is_file()) if p]
        if got:
            out[key] = got
    return out


def _check(models: list[str], sizes: list[int], rates: list[float], steps: int,
           fit_repeats: int, run_s: float, strategies: list[str] | None, tcp: str) -> None:
    """:func:`run`'s inputs, each a one-line error naming its flag."""
    for m in models:
        if m not in STEP_MODELS:
            raise ConfigError(f"--models: {m!r} is not one of {', '.join(STEP_MODELS)}")
    for n in sizes:
        if not 2 <= n <= 8:
            raise ConfigError(f"--sizes: {n} is not in 2..8")
    if FIT[0] not in sizes:
        raise ConfigError(f"--sizes: must hold {FIT[0]} (each strategy's compute is fitted "
                          f"at N = {FIT[0]}, {FIT[1]:g} Mbit/s)")
    for r in rates:
        if not 1 <= r <= 10_000:
            raise ConfigError(f"--rates: {r:g} is not in 1..10000 Mbit/s")
    if not 8 <= steps <= 10_000:
        raise ConfigError(f"--steps: {steps} is not in 8..10000")
    if not 1 <= fit_repeats <= 9:
        raise ConfigError(f"--fit-repeats: {fit_repeats} is not in 1..9")
    if not 0 <= run_s <= 600:
        raise ConfigError(f"--run-s: {run_s:g} is not in 0..600 seconds")
    if strategies is not None:
        known = {c.label for m in models for n in sizes for c in wc.cases(n, m)}
        for label in strategies:
            if label not in known:
                raise ConfigError(f"--strategies: {label!r} is not one of "
                                  f"{', '.join(sorted(known))}")
    if tcp and tcp not in congestion_controls():
        raise ConfigError(f"--tcp: {tcp!r} is not one of this kernel's "
                          f"({' '.join(congestion_controls()) or 'none listed'})")


def run(out: Path, models: list[str], sizes: list[int], rates: list[float],
        calibration: str, steps: int = 20, seed: int = 0, cores: int = 0,
        reuse: str | None = None, fit_repeats: int = 3, run_s: float = 2.0,
        strategies: list[str] | None = None, tcp: str = "") -> Path:
    """``strategies``: only these cases (their labels, as steps.md names them); ``tcp``:
    the congestion control between the test hosts ("": CUBIC, hosts.py)."""
    _check(models, sizes, rates, steps, fit_repeats, run_s, strategies, tcp)
    cores = cores or os.cpu_count() or 1
    fitted = cal.load(calibration)["fitted"]
    steps_of: dict[tuple[str, str, int, float], list[int]] = {}
    parts_of: dict[tuple[str, str, int, float], list] = {}
    resent_of: dict[tuple[str, str, int, float], list[list[int]]] = {}
    loads = None
    tcp_used = congestion_control(tcp)
    if reuse:
        found = load_found(Path(reuse))
        tcp_used = load_tcp(Path(reuse))
        parts_of = load_parts(Path(reuse))
        resent_of = load_resent(Path(reuse))
    else:
        reason = unavailable()
        if reason is not None:
            raise ConfigError(f"scale steps: needs test hosts (run as root): {reason}")
        out.mkdir(parents=True, exist_ok=True)
        loads = _loads(models, seed)  # sizes the runs, then predicts them: profiled once
        found = measure(out, models, sizes, rates, steps, seed, fit_repeats=fit_repeats,
                        run_s=run_s, fitted=fitted, cores=cores, steps_of=steps_of,
                        loads=loads, parts_of=parts_of, resent_of=resent_of,
                        strategies=strategies, tcp=tcp)
    out.mkdir(parents=True, exist_ok=True)
    pts = points(found, fitted, cores, seed, steps_of, loads, parts_of, resent_of, tcp_used)
    (out / "steps.json").write_text(json.dumps([asdict(p) for p in pts], indent=1))
    path = out / "steps.md"
    path.write_text("# Step times: predicted against runs on shaped links\n\n"
                    f"Calibration: {calibration}; compute fitted per strategy at N = "
                    f"{FIT[0]}, {FIT[1]:g} Mbit/s (the median of its runs)"
                    + (f"; TCP between the hosts: {tcp_used}" if tcp_used else "") + ".\n\n"
                    + table(pts) + "\n")
    return path
