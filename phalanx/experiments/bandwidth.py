"""Communication, not compute, limits distributed training: sync ring, sync main node, ASP
(2 shards) and model averaging (k=8) on test hosts whose links are shaped to 1 Gbit/s,
100 Mbit/s and 20 Mbit/s (``tc tbf``, both directions of every host's link).

Each worker is a test host (network namespace) of its own, with one process; ASP's two
shards get two more hosts (dedicated server machines). One torchrun group per (N, layout)
runs every rate one after another (``phalanx.experiments.hostgroup``), re-shaping the links
between runs. The kernel's byte counters of every host are read around each run.

Claims (the seeds'): (1) ring allreduce's traffic per worker stays flat (2X(N-1)/N < 2X) as
N grows while the main node's grows (2X(N-1)); (2) asynchronous training and model
averaging gain most on slow links.

The model is the MLP (0.94 MB of fp32 parameters): small enough that at 20 Mbit/s a ring
step's communication (~0.4-0.6 s) dwarfs its compute (a few ms), large enough that at
1 Gbit/s the link is not free. Two cores are shared by every process of a run (and by
other work on the machine), so compute is slow and noisy at 1 Gbit/s: ratios within one
run are what to read, not absolute samples/s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from phalanx.errors import ConfigError
from phalanx.experiments.common import verdict_block
from phalanx.experiments.hostgroup import Plan, PlannedRun, run_plan
from phalanx.metrics import plots
from phalanx.runtime.hosts import TestNetwork, unavailable

STRATEGIES = ("ring", "main", "asp", "average")
FLAGS = {"ring": ["--strategy", "sync", "--allreduce", "ring"],
         "main": ["--strategy", "sync", "--allreduce", "main"],
         # the servers' rule: Adam at 0.001, as in the PS study (tests/distributed/test_ps.py);
         # momentum at lr 0.05 diverged under ASP's staleness here (accuracy 0.10)
         "asp": ["--strategy", "asp", "--servers", "2", "--rule", "adam", "--lr", "0.001"],
         "average": ["--strategy", "average", "--period", "8"]}


@dataclass(frozen=True)
class Setting:
    quick: bool
    sizes: tuple[int, ...]
    rates: tuple[float, ...]
    steps: int
    target: float
    data: str

    def base_flags(self, seed: int) -> list[str]:
        limit = ["--train-limit", "4000", "--test-limit", "500"] if self.quick else \
            ["--train-limit", "30000", "--test-limit", "2000"]
        return ["--model", "mlp", "--data", self.data, "--batch-size", "32", "--lr", "0.05",
                "--rule", "momentum", "--max-steps", str(self.steps), "--eval-every",
                str(max(1, self.steps // 6)), "--seed", str(seed), "--threads", "1",
                "--no-progress", "--no-tensorboard", *limit]


def setting(quick: bool, data: str | None) -> Setting:
    if quick:
        return Setting(True, (2,), (100.0, 20.0), 8, 0.5, data or "synthetic")
    return Setting(False, (2, 3, 4), (1000.0, 100.0, 20.0), 60, 0.7, data or "fashion-mnist")


@dataclass
class Measured:
    strategy: str
    n: int
    rate: float
    samples_per_s: float
    time_to_target: float | None
    accuracy: float
    tx_per_step: dict[int, float]  # rank -> kernel tx bytes per step
    rx_per_step: dict[int, float]


def _label(strategy: str, n: int, rate: float) -> str:
    return f"{strategy}-n{n}-{int(rate)}mbit"


def _read(run_dir: Path, strategy: str, n: int, rate: float, world: int, steps: int,
          target: float) -> Measured:
    summary = json.loads((run_dir / "summary.json").read_text())
    evals = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines()]
    evals = [e for e in evals if e.get("kind") == "eval"]
    reached = next((e["wall_s"] for e in evals if e["test_accuracy"] >= target), None)
    net = {r: json.loads((run_dir / f"netstats-rank{r}.json").read_text()) for r in range(world)}
    return Measured(strategy, n, rate, summary["samples_per_s"], reached,
                    summary["test_accuracy"],
                    {r: v["tx_bytes"] / steps for r, v in net.items()},
                    {r: v["rx_bytes"] / steps for r, v in net.items()})


def _groups(s: Setting) -> list[tuple[int, list[str], int]]:
    """(hosts, strategies, N) per torchrun group: ASP needs N + 2 hosts."""
    out = []
    for n in s.sizes:
        out.append((n, ["ring", "main", "average"], n))
        out.append((n + 2, ["asp"], n))
    return out


def measure(out: Path, s: Setting, seed: int) -> list[Measured]:
    results = []
    for hosts, strategies, n in _groups(s):
        runs, index = [], []
        for rate in s.rates:
            for strategy in strategies:
                label = _label(strategy, n, rate)
                runs.append(PlannedRun([*s.base_flags(seed), *FLAGS[strategy], "--workers",
                                        str(n), "--out", str(out / "runs" / label)],
                                       rate_mbit=rate, netstats="eth0"))
                index.append((strategy, rate, label))
        with TestNetwork(hosts) as net:
            plan = Plan(runs, net.bridge_ns, net.ports())
            run_plan(net, 1, plan, out / "groups" / f"{strategies[0]}-n{n}", timeout_s=3600)
        for strategy, rate, label in index:
            results.append(_read(out / "runs" / label, strategy, n, rate, hosts, s.steps,
                                 s.target))
    return results


def _worker_tx(m: Measured) -> float:
    """Bytes per step the busiest WORKER host sent (ASP: ranks 0-1 are the shards)."""
    ranks = [r for r in m.tx_per_step if m.strategy != "asp" or r >= 2]
    return max(m.tx_per_step[r] for r in ranks)


Results = dict[tuple[str, int, float], Measured]   # (strategy, N, Mbit/s) -> run


def _table(by: Results, s: Setting) -> str:
    rows = [f"| N | link | strategy | samples/s | time to acc {s.target:.2f} (s) | final acc "
            "| busiest worker host tx / step (MB) | root / shard host tx+rx / step (MB) |",
            "|---|---|---|---|---|---|---|---|"]
    for n in s.sizes:
        for rate in s.rates:
            for strategy in STRATEGIES:
                m = by[(strategy, n, rate)]
                hub = {"main": m.tx_per_step[0] + m.rx_per_step[0],
                       "asp": max(m.tx_per_step[r] + m.rx_per_step[r] for r in (0, 1))}
                t = "not reached" if m.time_to_target is None else f"{m.time_to_target:.1f}"
                rows.append(f"| {n} | {rate:g} Mbit/s | {strategy} | {m.samples_per_s:.0f} | "
                            f"{t} | {m.accuracy:.3f} | {_worker_tx(m) / 1e6:.2f} | "
                            + (f"{hub[strategy] / 1e6:.2f}" if strategy in hub else "") + " |")
    return "\n".join(rows)


def _plots(out: Path, by: Results, s: Setting) -> None:
    biggest, slow = max(s.sizes), min(s.rates)
    series = {st: ([r for r in s.rates], [by[(st, biggest, r)].samples_per_s for r in s.rates])
              for st in STRATEGIES}
    plots.line_plot(out / "throughput.png", series, xlabel="link Mbit/s (log)",
                    ylabel="samples/s", title=f"Throughput vs bandwidth, N={biggest}",
                    logx=True)
    ttt = {st: ([r for r in s.rates if by[(st, biggest, r)].time_to_target is not None],
                [by[(st, biggest, r)].time_to_target for r in s.rates
                 if by[(st, biggest, r)].time_to_target is not None]) for st in STRATEGIES}
    plots.line_plot(out / "time_to_target.png", {k: v for k, v in ttt.items() if v[0]},
                    xlabel="link Mbit/s (log)", ylabel=f"seconds to accuracy {s.target}",
                    title=f"Time to accuracy {s.target} vs bandwidth, N={biggest}", logx=True)
    traffic = {"ring, busiest worker tx": (list(s.sizes), [
        _worker_tx(by[("ring", n, slow)]) / 1e6 for n in s.sizes]),
        "main node, root tx": (list(s.sizes), [
            by[("main", n, slow)].tx_per_step[0] / 1e6 for n in s.sizes])}
    plots.line_plot(out / "traffic_vs_n.png", traffic, xlabel="workers N",
                    ylabel="MB sent per step (kernel)", title="Per-host traffic vs N")


def _verdicts(by: Results, s: Setting) -> list[str]:
    """The three claims' blocks: ring traffic flat in N; averaging and ASP gain most on
    slow links."""
    biggest, slow, fast = max(s.sizes), min(s.rates), max(s.rates)
    ring_tx = [_worker_tx(by[("ring", n, slow)]) for n in s.sizes]
    main_tx = [by[("main", n, slow)].tx_per_step[0] for n in s.sizes]
    ring_growth, main_growth = ring_tx[-1] / ring_tx[0], main_tx[-1] / main_tx[0]
    x_bytes = ring_tx[0]  # at N=2 a ring worker sends 2X(1)/2 = X per step
    claim1 = (len(s.sizes) > 1 and ring_tx[-1] <= 2.05 * x_bytes
              and main_growth > 1.5 * ring_growth) if len(s.sizes) > 1 else None
    text1 = (f"kernel-counted bytes sent per step at {slow:g} Mbit/s, N = "
             f"{', '.join(map(str, s.sizes))}: ring's busiest worker "
             + ", ".join(f"{b / 1e6:.2f}" for b in ring_tx) + " MB (x"
             f"{ring_growth:.2f} from the first to the last N; bound 2X = "
             f"{2 * x_bytes / 1e6:.2f} MB); main node's root "
             + ", ".join(f"{b / 1e6:.2f}" for b in main_tx) + f" MB (x{main_growth:.2f}).")

    def gain(st: str, rate: float) -> float:
        return by[(st, biggest, rate)].samples_per_s / by[("ring", biggest, rate)].samples_per_s

    gains = {st: (gain(st, fast), gain(st, slow)) for st in ("asp", "average")}

    def gain_text(st: str) -> str:
        gf, gs = gains[st]
        tx = _worker_tx(by[(st, biggest, slow)]) / 1e6
        return (f"{st} / sync ring samples/s at N={biggest}: x{gf:.2f} at {fast:g} Mbit/s, "
                f"x{gs:.2f} at {slow:g} Mbit/s; its busiest worker host sends {tx:.2f} MB "
                f"per step (ring: {ring_tx[-1] / 1e6:.2f} MB).")

    return [
        verdict_block("ring allreduce's per-worker traffic stays flat as N grows while the "
                      "main node's grows", text1, claim1),
        verdict_block("model averaging gains most on slow links", gain_text("average"),
                      gains["average"][1] > gains["average"][0]),
        verdict_block("asynchronous training (ASP) gains most on slow links", gain_text("asp"),
                      gains["asp"][1] > gains["asp"][0]),
    ]


def report(out: Path, results: list[Measured], s: Setting, seed: int) -> Path:
    by: Results = {(m.strategy, m.n, m.rate): m for m in results}
    _plots(out, by, s)
    cmd = "phalanx experiments run bandwidth" + (" --quick" if s.quick else "")
    parts = [
        "# Bandwidth: sync ring, main node, ASP and averaging on shaped links",
        f"Reproduce (as root: test hosts are network namespaces):\n\n```sh\n{cmd}\n```",
        f"Setting: MLP (0.94 MB fp32) on {s.data}, batch 32 per worker, {s.steps} steps per "
        f"worker, momentum SGD lr 0.05, seed {seed}; one process per test host; ASP with 2 "
        "shards on two more hosts; averaging every 8 steps; links shaped with tc tbf in both "
        "directions. One seed: time-to-accuracy figures carry no interval; the byte and "
        "throughput ratios are what the verdicts rest on.",
        *_verdicts(by, s),
        "Why: averaging every 8 steps sends 1/8 of the ring's bytes, so the slower the link "
        "the larger its lead. ASP removes the wait for the slowest worker but not the bytes: "
        "each worker pushes a gradient (X) and then pulls the weights (X) every step, one "
        "after the other, and each of the two shard hosts carries N·X/2 in and N·X/2 out per "
        "round of pushes (2X each way at N=4, against a ring worker's 1.5X): the shard links "
        "are the bottleneck, so on a slow link ASP is bandwidth-bound like sync.",
        _table(by, s),
        "![throughput](throughput.png)\n\n![time to target](time_to_target.png)\n\n"
        "![traffic](traffic_vs_n.png)",
        "Notes: 2 CPU cores are shared by every process of a run (up to 6) and by other work "
        "on the machine, so at 1 Gbit/s compute, not the link, sets the pace and samples/s "
        "there is noisy. Bytes are the kernel's counters "
        "(/sys/class/net/eth0/statistics in each test host), per step of the run, including "
        "TCP/IP headers, start-up broadcast and evaluation barriers.",
    ]
    path = out / "report.md"
    path.write_text("\n\n".join(parts) + "\n")
    return path


def run(out: Path, *, quick: bool, data: str | None, seed: int) -> Path:
    reason = unavailable()
    if reason is not None:
        raise ConfigError(f"experiments run bandwidth: needs test hosts (run as root): {reason}")
    s = setting(quick, data)
    out.mkdir(parents=True, exist_ok=True)
    results = measure(out, s, seed)
    (out / "results.json").write_text(json.dumps([m.__dict__ for m in results], indent=1))
    return report(out, results, s, seed)
