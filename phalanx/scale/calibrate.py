"""``phalanx scale calibrate``: alpha (per message) and beta (per byte) of a link class fitted
from messages timed between two test hosts (network namespaces on a bridge, links shaped by
``tc tbf`` as ``phalanx/runtime/hosts.py`` makes them), at each rate; the kernel's byte
counters give the bytes on the wire per payload byte (framing). Saved with the machine and
the date they came from, and applied to a network by :func:`apply`.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from phalanx.cluster.core.cluster_file import read_yaml
from phalanx.errors import ConfigError
from phalanx.runtime.hosts import TestNetwork, congestion_control, unavailable
from phalanx.scale.network import Link, Network

PORT = 29555


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Least squares t = alpha + beta x bytes: (alpha, beta, r^2)."""
    if len({x for x, _ in points}) < 2:
        raise ConfigError("calibration: need messages of at least two sizes")
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    beta = sxy / sxx
    alpha = my - beta * mx
    ss = sum((y - my) ** 2 for _, y in points) or 1e-30
    res = sum((y - alpha - beta * x) ** 2 for x, y in points)
    return alpha, beta, 1 - res / ss


def _sizes(rate_mbit: float) -> list[int]:
    # up to ~0.5 s per message at the rate: enough bytes that beta dominates
    top = max(256 << 10, min(16 << 20, int(rate_mbit * 1e6 / 8 * 0.5)))
    sizes, s = [], 16 << 10
    while s <= top:
        sizes.append(s)
        s *= 4
    return sizes


# the fan-out probe's messages: a step's bucket of a small model to a GPT's gradient
FANOUT_SIZES = (64 << 10, 256 << 10, 1 << 20, 4 << 20)
FANOUT_REPEATS = 5


def _probe(net: TestNetwork, sizes: list[int], repeats: int, gap: float, duplex: bool
           ) -> tuple[list[dict], int, int]:
    """One probe run between the first two hosts: its points and the bytes each sent."""
    a, b = net.hosts[:2]
    server = b.popen([sys.executable, "-m", "phalanx.scale.probe", "server", b.addr, str(PORT)],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        tx0, back0 = a.tx_bytes(), b.tx_bytes()
        done = a.run([sys.executable, "-m", "phalanx.scale.probe", "client", b.addr, str(PORT),
                      ",".join(map(str, sizes)), str(repeats), str(gap)]
                     + (["duplex"] if duplex else []), timeout=600)
        tx, back = a.tx_bytes() - tx0, b.tx_bytes() - back0
    finally:
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    if done.returncode != 0:
        raise ConfigError(f"calibrate: the probe failed: {done.stderr.strip()[-200:]}")
    return json.loads(done.stdout), tx, back


def _gloo_probe(net: TestNetwork, sizes: list[int], repeats: int, gap: float
                ) -> dict[str, list[dict]]:
    """The duplex probe as the protocols move bytes (:mod:`phalanx.scale.gloo_probe`)."""
    return _gloo_group(net, 2, "gloo_probe", "gloo probe",
                       [str(PORT + 1), ",".join(map(str, sizes)), str(repeats), str(gap)])


def fanout_probe(net: TestNetwork, sizes: tuple[int, ...] = FANOUT_SIZES,
                 repeats: int = FANOUT_REPEATS) -> list[dict]:
    """The main node's fan-out on the first three hosts (:mod:`phalanx.scale.fanout_probe`)."""
    return _gloo_group(net, 3, "fanout_probe", "fan-out probe",
                       [str(PORT + 2), ",".join(map(str, sizes)), str(repeats)])


def _gloo_group(net: TestNetwork, k: int, module: str, what: str, args: list[str]) -> Any:
    """``phalanx.scale.MODULE RANK ADDR *ARGS`` on the first ``k`` hosts (a gloo group, rank
    0's host the master): rank 0's last line of JSON."""
    a = net.hosts[0]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": a.iface, "OMP_NUM_THREADS": "1"}
    procs = [h.popen([sys.executable, "-m", f"phalanx.scale.{module}", str(r), a.addr, *args],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r, h in enumerate(net.hosts[:k])]
    try:
        out, err = procs[0].communicate(timeout=900)
        for p in procs[1:]:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if procs[0].returncode != 0:
        raise ConfigError(f"calibrate: the {what} failed: {err.strip()[-200:]}")
    return json.loads(out.strip().splitlines()[-1])


def measure(rates: list[float], repeats: int = 3, gap: float = 0.05) -> dict[str, Any]:
    """Time messages at each rate between two fresh test hosts, one way and both ways at
    once, and the main node's fan-out on three; needs root."""
    why = unavailable()
    if why:
        raise ConfigError(f"calibrate: test hosts unavailable: {why}")
    out: dict[str, Any] = {}
    with TestNetwork(3) as net:
        for rate in rates:
            net.shape(rate)
            sizes = _sizes(rate)
            rows, tx, back = _probe(net, sizes, repeats, gap, duplex=False)
            both, _, _ = _probe(net, sizes, repeats, gap, duplex=True)
            gloo = _gloo_probe(net, sizes, repeats, gap)
            payload = sum((s + 8) * (repeats + 1) for s in sizes) + 8
            # the receiver's bytes: its ACKs (and the 1-byte answers, counted as ACKs)
            out[f"{rate:g}"] = {"rate_mbit": rate, "points": rows, "duplex_points": both,
                                "gloo_points": gloo["points"],
                                "gloo_duplex_points": gloo["duplex_points"],
                                "fanout_points": fanout_probe(net),
                                "wire_bytes_per_payload_byte": tx / payload,
                                "ack_bytes_per_payload_byte": back / payload}
    return out


def fit_bucket(points: list[tuple[float, float]], burst: float | None = None
               ) -> tuple[float, float, float, float]:
    """t = alpha + beta x max(0, bytes - burst): a link behind a token bucket. The burst is
    chosen on a grid (least squares for each) unless given. (alpha, beta, burst, r^2)."""
    top = max(x for x, _ in points)
    grid = [burst] if burst is not None else [0.0] + [
        16384 * 1.15 ** k for k in range(80) if 16384 * 1.15 ** k < top / 2]
    best = None
    for b in grid:
        shifted = [(max(0.0, x - b), y) for x, y in points]
        if len({x for x, _ in shifted}) < 2:
            continue
        alpha, beta, r2 = fit_line(shifted)
        if best is None or r2 > best[3]:
            best = (alpha, beta, b, r2)
    if best is None:
        raise ConfigError("calibration: need messages of at least two sizes above the burst")
    return best


def fit(measured: dict[str, Any], fit_on: list[str] | None = None) -> dict[str, Any]:
    """alpha, beta, the token bucket, the link efficiency (fitted bandwidth / nominal rate)
    and the duplex factor (one direction's bandwidth left when both are busy) per rate."""
    fitted = {}
    for key, m in measured.items():
        if fit_on is not None and key not in fit_on:
            continue
        alpha, beta, burst, r2 = fit_bucket([(p["bytes"], p["seconds"]) for p in m["points"]])
        duplex, source = 1.0, "none"
        # one way's per-byte time over both ways', from gloo where measured (what the
        # protocols do), else from the raw-socket probe (calibrations before 2026-11-29)
        for one, two, name in (("gloo_points", "gloo_duplex_points", "gloo"),
                               ("points", "duplex_points", "sockets")):
            if m.get(one) and m.get(two):
                _, b1, _, _ = fit_bucket([(p["bytes"], p["seconds"]) for p in m[one]], burst)
                _, b2, _, _ = fit_bucket([(p["bytes"], p["seconds"]) for p in m[two]], burst)
                duplex, source = (min(1.0, b1 / b2) if b2 > 0 and b1 > 0 else 1.0), name
                break
        nominal = m["rate_mbit"] * 1e6 / 8
        fitted[key] = {"rate_mbit": m["rate_mbit"], "alpha_s": alpha, "alpha_fit_s": alpha,
                       "beta_s_per_byte": beta,
                       "burst_bytes": burst, "duplex": duplex, "duplex_from": source,
                       "efficiency": (1 / beta) / nominal if beta > 0 else 0.0, "r2": r2,
                       "wire_overhead": m["wire_bytes_per_payload_byte"] - 1,
                       "ack_overhead": m.get("ack_bytes_per_payload_byte", 0.0),
                       "fanout": fit_fanout(m.get("fanout_points") or [])}
    alpha = gloo_alpha({k: m for k, m in measured.items() if k in fitted}, fitted)
    if alpha is not None:
        for v in fitted.values():
            v["alpha_s"], v["alpha_from"] = alpha, "gloo small messages, every rate"
    return fitted


def fit_fanout(points: list[dict]) -> list[list[float]]:
    """[bytes, share one after the other] per size of the fan-out probe: 0 where a host's
    two sends shared its link (the first worker had the sum when the last did: first /
    last = 1), 1 where they went one after the other (0.5 at two workers): 2 (1 - f)."""
    return [[float(p["bytes"]), min(1.0, max(0.0, 2 * (1 - p["first_over_last"])))]
            for p in sorted(points, key=lambda p: p["bytes"])]


def gloo_alpha(measured: dict[str, Any], fitted: dict[str, Any]) -> float | None:
    """One latency for every rate: the median time of gloo's messages that fit in every
    rate's token bucket (a message and its one-float answer, as the protocols send it).
    A message's latency does not depend on the bucket's rate. The per-rate lines'
    intercepts do not give it (one calibration: 0.85, 0.05 and -0.24 ms at 1000, 100 and
    20 Mbit/s): a message larger than the bucket hides its latency behind its bytes (the
    same calibration's gloo message of 262 KB at 100 Mbit/s: 2.47 ms, 2.43 of them bytes
    beyond the bucket; ``collectives._repeat`` models it). None without gloo points."""
    small = min((v["burst_bytes"] for v in fitted.values()), default=0.0)
    times = [p["seconds"] for m in measured.values() for p in m.get("gloo_points") or []
             if p["bytes"] <= small]
    return float(statistics.median(times)) if times else None


def save(path: Path, measured: dict[str, Any], fitted: dict[str, Any],
         server: dict[str, Any] | None = None, refit_of: str | None = None,
         measured_on: str | None = None, tcp: str | None = None) -> None:
    """``tcp``: the congestion control the measurements ran under (default: what test
    hosts run now; a refit passes its measurements' own, "" where they did not say)."""
    from_commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True, check=False, cwd=Path(__file__).parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "machine": platform.node(), "cpus": platform.machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": from_commit.stdout.strip(), "how": "phalanx scale calibrate: two test "
        "hosts, tc tbf both directions, one TCP connection, message + 1-byte answer",
        "tcp": congestion_control() if tcp is None else tcp,
        **({"refit_of": refit_of, "measured_on": measured_on} if refit_of else {}),
        "fitted": fitted, "server": server, "measured": measured}, indent=1))


def load(path: str | Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
        fitted = data["fitted"]
        for v in fitted.values():
            float(v["alpha_s"]), float(v["efficiency"])
        if not fitted:
            raise ValueError
    except OSError as e:
        raise ConfigError(f"--calibration {path}: cannot read ({e.strerror})") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ConfigError(f"--calibration {path}: not a calibration file of 'phalanx scale "
                          f"calibrate' (fitted.<rate>.alpha_s / efficiency)") from None
    return data


def link_for(fitted: dict[str, Any], rate_mbit: float) -> Link:
    """The NIC link at ``rate_mbit`` from the nearest calibrated rate (log distance): its
    alpha, and its efficiency times the rate."""
    near = min(fitted.values(), key=lambda v: abs(math.log(v["rate_mbit"] / rate_mbit)))
    return Link(bandwidth=rate_mbit * 1e6 / 8 * max(near["efficiency"], 1e-3),
                latency=max(near["alpha_s"], 0.0), burst=near.get("burst_bytes", 0.0),
                duplex=max(near.get("duplex", 1.0), 1e-3),
                fanout=tuple((float(b), float(x)) for b, x in near.get("fanout") or ()))


def apply(net: Network, path: str) -> Network:
    """The network with its NIC links as calibrated (nearest calibrated rate)."""
    fitted = load(path)["fitted"]
    nic = net.links.nic
    links = replace(net.links, nic=replace(link_for(fitted, nic.bandwidth * 8 / 1e6),
                                           oversubscription=nic.oversubscription))
    return Network(net.topology, links, net.extra, net.extra_nic_scale)


def read_yaml_file(path: str) -> Any:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"--cluster {path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--cluster {path}: not UTF-8 text") from None
    return read_yaml(text, f"--cluster {path}", ConfigError)


def summary(fitted: dict[str, Any]) -> str:
    lines = ["| rate (Mbit/s) | alpha (ms) | effective (Mbit/s) | efficiency | burst (KB) | "
             "duplex | r^2 | wire overhead | ACKs | fan-out in turn (by size) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for v in sorted(fitted.values(), key=lambda v: -v["rate_mbit"]):
        lines.append(f"| {v['rate_mbit']:g} | {v['alpha_s'] * 1e3:.3f} | "
                     f"{8 / v['beta_s_per_byte'] / 1e6:.2f} | {v['efficiency']:.3f} | "
                     f"{v['burst_bytes'] / 1e3:.0f} | {v['duplex']:.3f} | {v['r2']:.4f} | "
                     f"{v['wire_overhead']:+.2%} | {v.get('ack_overhead', 0):+.2%} | "
                     + (", ".join(f"{b / 1024:.0f} KB {x:.2f}" for b, x in v["fanout"])
                        if v.get("fanout") else "-") + " |")
    return "\n".join(lines)


def median(values: list[float]) -> float:
    return float(statistics.median(values))
