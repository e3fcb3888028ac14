"""``phalanx scale validate``: predictions against real runs the model was not fitted to.

The real runs are the bandwidth study's (``phalanx experiments run bandwidth``, its
``results.json``): the MLP (235,146 fp32 parameters) trained by sync ring, sync main node,
ASP with 2 shards and model averaging (every 8 steps), one process per test host, at
N = 2, 3, 4 on links shaped to 1000, 100 and 20 Mbit/s; step times from the runs'
steady-state samples/s, bytes from the kernel's counters of each host.

What the model is given:

* links: ``phalanx scale calibrate``'s fit (alpha, beta, token bucket, duplex factor) at each
  rate, from probes between two test hosts, not from these runs;
* compute: fitted on the subset, each strategy's run at N = 2 and 1000 Mbit/s (where the
  link barely matters): the step's compute and per-step overhead c of that strategy's loop;
* bytes: the protocol's exact payload x (1 + the framing and ACK overhead the calibration
  measured on the wire) + a per-step constant (control messages) fitted on the same subset.

Everything else (N = 3, 4; 100 and 20 Mbit/s) is held out. ASP's step comes from the event
simulation (2 shards on hosts of their own, push then pull)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.errors import ConfigError
from phalanx.scale import calibrate as cal
from phalanx.scale.eventsim import AsyncSpec, simulate
from phalanx.scale.network import hosts_network
from phalanx.scale.predict import predict
from phalanx.scale.setting import Setting
from phalanx.scale.workload import Workload

BATCH = 32
STRATEGY = {"ring": ("sync", "ring"), "main": ("sync", "main"), "average": ("average", "ring"),
            "asp": ("asp", "")}


@dataclass(frozen=True)
class Point:
    strategy: str
    n: int
    rate: float
    measured_step_s: float
    predicted_step_s: float
    measured_bytes: float
    predicted_bytes: float
    held_out: bool

    @property
    def step_error(self) -> float:
        return self.predicted_step_s / self.measured_step_s - 1

    @property
    def bytes_error(self) -> float:
        return self.predicted_bytes / self.measured_bytes - 1


def load_runs(path: Path) -> list[dict[str, Any]]:
    try:
        rows = json.loads(path.read_text())
        for r in rows:
            str(r["strategy"]), int(r["n"]), float(r["rate"]), float(r["samples_per_s"])
            dict(r["tx_per_step"])
    except OSError as e:
        raise ConfigError(f"--runs {path}: cannot read ({e.strerror})") from None
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"--runs {path}: not the bandwidth study's results.json") from None
    return rows


def _workers_tx(run: dict[str, Any]) -> float:
    """Bytes per step the busiest worker host sent (ASP: ranks 0-1 are the shards)."""
    tx = {int(k): float(v) for k, v in run["tx_per_step"].items()}
    ranks = [r for r in tx if run["strategy"] != "asp" or r >= 2]
    return max(tx[r] for r in ranks)


def predict_run(w: Workload, run: dict[str, Any], fitted: dict[str, Any], compute: float,
                cores: int, server: dict[str, Any] | None = None) -> tuple[float, float]:
    """(step seconds, bytes the busiest worker sends) of one run."""
    n, rate, strategy = int(run["n"]), float(run["rate"]), run["strategy"]
    link = cal.link_for(fitted, rate)
    # a host sends its payload with headers, and ACKs for what it receives (as much as it
    # sends, in all four strategies)
    overhead = 1 + statistics.median(v["wire_overhead"] + v.get("ack_overhead", 0.0)
                                     for v in fitted.values())
    procs = n + (2 if strategy == "asp" else 0)
    c = compute * max(1.0, procs / cores) if cores else compute
    wl = w.with_compute(c, "fitted")
    if strategy == "asp":
        costs = {k: float(server[k]) for k in ("server_msg_s", "server_byte_s")
                 if server and k in server}
        s = Setting(strategy="asp", workers=n, servers=2, **costs)
        spec = AsyncSpec(workers=n, shards=2, steps=60, compute_s=c,
                         push_bytes=w.grad_bytes, pull_bytes=w.grad_bytes,
                         worker_bw=link.bandwidth, shard_bw=link.bandwidth,
                         latency_s=link.latency, burst_bytes=link.burst,
                         duplex=link.duplex, server_msg_s=s.server_msg_s,
                         server_byte_s=s.server_byte_s, consistency="asp")
        r = simulate(spec)
        # bytes a worker sends per step: its push (the pulls' requests are headers)
        return r.step_s, w.grad_bytes * overhead
    name, algorithm = STRATEGY[strategy]
    p = predict(wl, Setting(strategy=name, workers=n, allreduce=algorithm, period=8),
                hosts_network(n, link))
    return p.step_s, p.bytes_per_worker * overhead


def fit_compute(w: Workload, runs: list[dict[str, Any]], fitted: dict[str, Any],
                cores: int, server: dict[str, Any] | None = None) -> float:
    """c that makes the median relative error on the fit subset zero (bisection: the
    predicted step grows with c)."""
    lo, hi = 1e-5, 10.0
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        errs = [predict_run(w, r, fitted, mid, cores, server)[0] / (r["n"] * BATCH /
                                                              r["samples_per_s"]) - 1
                for r in runs]
        lo, hi = (mid, hi) if statistics.median(errs) < 0 else (lo, mid)
    return (lo * hi) ** 0.5


def validate(w: Workload, runs: list[dict[str, Any]], fitted: dict[str, Any],
             fit_n: int = 2, fit_rate: float = 1000.0, cores: int = 0,
             server: dict[str, Any] | None = None
             ) -> tuple[dict[str, float], dict[str, float], list[Point]]:
    """Fit each strategy's compute c and per-step extra bytes on its run at (fit_n,
    fit_rate); predict every run. ``cores`` > 0: compute scales with processes / cores
    (0: it does not; the recorded runs shared the machine with a load of ~50, so a run's
    own processes barely changed any one's share)."""
    compute, extra = {}, {}
    for strategy in sorted({r["strategy"] for r in runs}):
        subset = [r for r in runs if r["strategy"] == strategy and int(r["n"]) == fit_n
                  and float(r["rate"]) == fit_rate]
        if not subset:
            raise ConfigError(f"validate: no {strategy} run at N={fit_n} and {fit_rate:g} "
                              f"Mbit/s to fit on")
        compute[strategy] = fit_compute(w, subset, fitted, cores, server)
        extra[strategy] = statistics.median(
            _workers_tx(r) - predict_run(w, r, fitted, compute[strategy], cores, server)[1]
            for r in subset)
    points = []
    for r in runs:
        step, nbytes = predict_run(w, r, fitted, compute[r["strategy"]], cores, server)
        held = not (int(r["n"]) == fit_n and float(r["rate"]) == fit_rate)
        points.append(Point(r["strategy"], int(r["n"]), float(r["rate"]),
                            r["n"] * BATCH / r["samples_per_s"], step, _workers_tx(r),
                            nbytes + extra[r["strategy"]], held))
    return compute, extra, points


def table(points: list[Point]) -> list[str]:
    lines = ["| strategy | N | link (Mbit/s) | measured step (ms) | predicted (ms) | error | "
             "measured MB/worker | predicted | error | set |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p in sorted(points, key=lambda p: (-p.rate, p.n, p.strategy)):
        lines.append(f"| {p.strategy} | {p.n} | {p.rate:g} | {p.measured_step_s * 1e3:.0f} | "
                     f"{p.predicted_step_s * 1e3:.0f} | {p.step_error:+.1%} | "
                     f"{p.measured_bytes / 1e6:.3f} | {p.predicted_bytes / 1e6:.3f} | "
                     f"{p.bytes_error:+.1%} | {'held out' if p.held_out else 'fit'} |")
    return lines


def errors_summary(points: list[Point]) -> list[str]:
    out = ["| held-out points | n | median abs step error | worst | median abs bytes error | "
           "worst |", "|---|---|---|---|---|---|"]
    groups = {"20 + 100 Mbit/s (bandwidth-bound)": [p for p in points if p.held_out
                                                     and p.rate <= 100],
              "1000 Mbit/s (compute noise)": [p for p in points if p.held_out
                                              and p.rate > 100],
              "all held out": [p for p in points if p.held_out]}
    for strategy in sorted({p.strategy for p in points}):
        groups[f"20 + 100 Mbit/s, {strategy}"] = [p for p in points if p.held_out
                                                  and p.rate <= 100 and p.strategy == strategy]
    for name, ps in groups.items():
        if not ps:
            continue
        se = [abs(p.step_error) for p in ps]
        be = [abs(p.bytes_error) for p in ps]
        out.append(f"| {name} | {len(ps)} | {statistics.median(se):.1%} | {max(se):.1%} | "
                   f"{statistics.median(be):.1%} | {max(be):.1%} |")
    return out


