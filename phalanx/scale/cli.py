"""``phalanx scale``: predict, report, async, published, calibrate, validate, bytes
(docs/scale.md).

Every flag is checked where it is owned (``Setting``, ``Shape``, ``AsyncSpec``); a bad value
is one line naming it and exit 2."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from phalanx.errors import ConfigError
from phalanx.scale import calibrate as cal
from phalanx.scale import validate as val
from phalanx.scale.convergence import Convergence
from phalanx.scale.eventsim import CONSISTENCY, AsyncSpec, simulate
from phalanx.scale.network import Network, gbit, network_from_mapping
from phalanx.scale.predict import predict, ps_bytes
from phalanx.scale.published import all_checks
from phalanx.scale.report import checks_markdown, write_report
from phalanx.scale.setting import STRATEGIES, Compression, Setting, Stragglers
from phalanx.scale.sweep import SWEEP_NS, SWEEP_STRATEGIES, Shape, sweep
from phalanx.scale.workload import CATALOG, Workload, catalog, describe


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        values = []
    if not values or any(not 1 <= v <= 1 << 20 for v in values):
        raise ConfigError(f"{flag}: {text!r} is not a comma-separated list of integers "
                          f"in 1..1048576")
    return values


def _workload(args: argparse.Namespace) -> Workload:
    if args.profile_here:
        from phalanx.scale.profile import profile_model  # torch: only to profile a model

        w = profile_model(args.model, args.batch or 32)
    else:
        w = catalog(args.model, args.batch)
    if args.samples_per_s is not None:
        if not args.samples_per_s > 0:
            raise ConfigError(f"--samples-per-s: {args.samples_per_s} is not > 0")
        w = w.with_compute(w.batch / args.samples_per_s,
                           f"given: {args.samples_per_s:g} samples/s per device")
    return w


def _shape(args: argparse.Namespace) -> Shape:
    return Shape(gpus_per_server=args.gpus_per_server, servers_per_rack=args.servers_per_rack,
                 nic_gbit=args.nic_gbit, intra_gbit=args.intra_gbit,
                 latency_us=args.latency_us, oversubscription=args.oversubscription)


def _network(args: argparse.Namespace, n: int) -> Network:
    if args.cluster:
        from_file = network_from_mapping(cal.read_yaml_file(args.cluster), args.cluster)
        return cal.apply(from_file, args.calibration) if args.calibration else from_file
    net = _shape(args).network(n)
    return cal.apply(net, args.calibration) if args.calibration else net


def _server_costs(args: argparse.Namespace) -> dict[str, float]:
    """The shard's per-message and per-byte costs from --calibration, when it measured them."""
    if not getattr(args, "calibration", None):
        return {}
    server = cal.load(args.calibration).get("server") or {}
    return {k: float(server[k]) for k in ("server_msg_s", "server_byte_s") if k in server}


def _setting(args: argparse.Namespace, strategy: str, n: int) -> Setting:
    return Setting(**_server_costs(args), strategy=strategy, workers=n, servers=args.servers,
                   allreduce=args.allreduce, bucket_mb=args.bucket_mb,
                   fusion_cycle_ms=args.fusion_cycle_ms,
                   compress=Compression.parse(args.compress), period=args.period,
                   staleness=args.staleness, softsync=args.softsync, nfetch=args.nfetch,
                   npush=args.npush, stages=args.stages, micro_batches=args.micro_batches,
                   tensor=args.tensor, zero_stage=args.zero_stage,
                   server_placement=args.server_placement,
                   duplex=args.duplex, sparse_allreduce=args.sparse_allreduce,
                   stragglers=Stragglers(args.stragglers))


def _cmd_predict(args: argparse.Namespace) -> int:
    w = _workload(args)
    conv = Convergence()
    rows = []
    for n in _ints(args.workers, "--workers"):
        p = predict(w, _setting(args, args.strategy, n), _network(args, n))
        row = p.row()
        row["time_to_target_s (model)"] = round(conv.time_to_target(p), 3)
        rows.append(row)
        if not args.json:
            print(f"{args.strategy} N={n}: step {p.step_s * 1e3:.2f} ms = compute "
                  f"{p.compute_s * 1e3:.2f} + exposed comm {p.exposed_comm_s * 1e3:.2f} + "
                  f"server {p.server_s * 1e3:.2f} + bubble {p.bubble_s * 1e3:.2f} + "
                  f"straggler {p.straggler_s * 1e3:.2f}; {p.bytes_per_worker / 1e6:.2f} MB "
                  f"in {p.messages:g} messages per worker; bottleneck {p.bottleneck}; "
                  f"{p.samples_per_s:,.0f} samples/s; "
                  f"efficiency {p.efficiency:.3f}"
                  + ("" if p.staleness_mean is None else
                     f"; staleness ~{p.staleness_mean:.1f}"))
    if args.json:
        print(json.dumps({"model": describe(w), "predictions": rows}))
    else:
        print(describe(w))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    w = _workload(args)
    strategies = args.strategies.split(",") if args.strategies else list(SWEEP_STRATEGIES)
    for s in strategies:
        if s not in STRATEGIES:
            raise ConfigError(f"--strategies: {s!r} is not one of {', '.join(STRATEGIES)}")
    ns = _ints(args.workers or ",".join(map(str, SWEEP_NS)), "--workers")
    shape = _shape(args)
    t0 = time.perf_counter()
    rows = sweep(w, strategies, ns, lambda n: _network(args, n))
    if args.sweep:  # bandwidth x N x model size: the efficiency grid, as CSV
        grid = []
        for g in (1, 10, 25, 100, 400):
            for scale in (0.25, 1.0, 4.0):
                # a model `scale` times the size: parameters and compute both (FLOPs grow
                # with parameters at a fixed batch), so latency's share changes
                big = Workload(**{**w.__dict__, "step_compute_s": w.step_compute_s * scale,
                                  "layers": tuple(
                    type(layer)(name=layer.name, params=int(layer.params * scale),
                                compute_share=layer.compute_share) for layer in w.layers)})
                net_shape = Shape(**{**shape.__dict__, "nic_gbit": float(g)})
                for r in sweep(big, strategies, ns, net_shape.network):
                    if r.prediction is not None:
                        grid.append((g, scale, r.strategy, r.workers,
                                     round(r.prediction.efficiency, 4),
                                     r.prediction.bottleneck))
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "sweep.csv").write_text("nic_gbit,model_scale,strategy,workers,efficiency,"
                                       "bottleneck\n" + "\n".join(",".join(map(str, g))
                                                                  for g in grid) + "\n")
    command = "phalanx " + " ".join(sys.argv[1:])
    path = write_report(Path(args.out), w, rows, shape, Convergence(), command.strip())
    print(f"{len(rows)} predictions in {time.perf_counter() - t0:.2f} s -> {path}")
    return 0


def _cmd_async(args: argparse.Namespace) -> int:
    w = _workload(args)
    s = _setting(args, "asp", args.workers_async)
    push, pull = ps_bytes(w, s)
    spec = AsyncSpec(workers=args.workers_async, shards=args.servers, steps=args.steps,
                     compute_s=w.step_compute_s, push_bytes=push, pull_bytes=pull,
                     worker_bw=gbit(args.nic_gbit), shard_bw=gbit(args.nic_gbit),
                     latency_s=args.latency_us * 1e-6, server_msg_s=s.server_msg_s,
                     server_byte_s=s.server_byte_s, consistency=args.consistency,
                     bound=args.softsync if args.consistency == "softsync" else args.staleness,
                     stragglers=Stragglers(args.stragglers), seed=args.seed)
    t0 = time.perf_counter()
    r = simulate(spec)
    row = r.row()
    row["sim_wall_s"] = round(time.perf_counter() - t0, 3)
    if args.json:
        row["staleness_hist"] = r.staleness
        print(json.dumps(row))
        return 0
    print(f"{args.consistency}: {args.workers_async} workers x {args.steps} steps against "
          f"{args.servers} shard(s) ({describe(w)})")
    print("  " + "  ".join(f"{k} {v}" for k, v in row.items()))
    top = sorted(r.staleness.items())
    print("  staleness histogram (value: updates): " +
          ", ".join(f"{k}: {v}" for k, v in top[:12]) + (" ..." if len(top) > 12 else ""))
    return 0


def _cmd_published(args: argparse.Namespace) -> int:
    print("\n".join(checks_markdown(all_checks())))
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    try:
        rates = [float(v) for v in args.rates.split(",") if v]
    except ValueError:
        rates = []
    if not rates or any(not 0.1 <= r <= 100_000 for r in rates):
        raise ConfigError(f"--rates: {args.rates!r} is not a list of Mbit/s in 0.1..100000")
    if not 1 <= args.repeats <= 100:
        raise ConfigError(f"--repeats: {args.repeats} is not in 1..100")
    if args.refit:  # the measurements of an earlier calibration, fitted again
        old = cal.load(args.refit)
        measured, server = old.get("measured"), old.get("server")
        if not isinstance(measured, dict) or not measured:
            raise ConfigError(f"--refit {args.refit}: holds no measurements to fit")
        try:
            fitted = cal.fit(measured)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ConfigError(f"--refit {args.refit}: its measurements are not those of "
                              f"'phalanx scale calibrate'") from None
        cal.save(Path(args.out), measured, fitted, server, refit_of=args.refit,
                 measured_on=old.get("measured_on") or old.get("date"),
                 tcp=str(old.get("tcp") or ""))
        print(cal.summary(fitted))
        print(f"-> {args.out}")
        return 0
    measured = cal.measure(rates, args.repeats)
    fitted = cal.fit(measured)
    from phalanx.scale.server_cost import measure_server  # torch: a real shard

    server = None if args.no_server else measure_server()
    cal.save(Path(args.out), measured, fitted, server)
    print(cal.summary(fitted))
    if server:
        print(f"shard: {server['server_msg_s'] * 1e6:.1f} us per push + "
              f"{server['server_byte_s'] * 1e9:.3f} ns per byte (r^2 {server['r2']:.4f})")
    print(f"-> {args.out}")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    calibration = cal.load(args.calibration)
    from phalanx.scale.profile import profile_model  # torch: the MLP's layers

    w = profile_model("mlp", val.BATCH)  # its layers; compute is fitted on the subset
    runs = val.load_runs(Path(args.runs))
    compute, extra, points = val.validate(w, runs, calibration["fitted"],
                                          server=calibration.get("server"))
    lines = [f"Calibration: {args.calibration} ({calibration.get('machine')}, "
             f"{calibration.get('date')}); runs: {args.runs}.", "",
             "Fitted on each strategy's run at N = 2, 1000 Mbit/s: compute per step " +
             ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in compute.items()) +
             "; per-step extra bytes " + ", ".join(f"{k} {v / 1e3:.1f} KB"
                                                   for k, v in extra.items()) + ".", "",
             cal.summary(calibration["fitted"]), ""]
    lines += val.errors_summary(points) + [""] + val.table(points)
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / args.name).write_text(text)
    print(text)
    return 0


def _cmd_bytes(args: argparse.Namespace) -> int:
    from phalanx.scale import wire_check  # torch and test hosts: only for this action

    steps = _ints(args.steps, "--steps")
    if len(steps) != 2:
        raise ConfigError(f"--steps: {args.steps!r} is not two step counts SHORT,LONG")
    models = [m for m in args.models.split(",") if m]
    path = wire_check.run(Path(args.out), models, _ints(args.sizes, "--sizes"), *steps,
                          seed=args.seed, reuse=args.reuse)
    print(path.read_text())
    print(f"-> {path}")
    return 0


def _cmd_steps(args: argparse.Namespace) -> int:
    from phalanx.scale import step_check  # torch and test hosts: only for this action

    if args.across:
        from phalanx.scale.steps_across import across

        path = across([Path(p) for p in args.across.split(",") if p], args.calibration,
                      Path(args.out), cores=args.cores)
        print(path.read_text())
        print(f"-> {path}")
        return 0
    models = [m for m in args.models.split(",") if m]
    rates = _floats(args.rates, "--rates")
    path = step_check.run(Path(args.out), models, _ints(args.sizes, "--sizes"), rates,
                          args.calibration, steps=args.steps, seed=args.seed,
                          cores=args.cores, reuse=args.reuse, fit_repeats=args.fit_repeats,
                          run_s=args.run_s, tcp=args.tcp,
                          strategies=[x for x in args.strategies.split(",") if x]
                          if args.strategies else None)
    print(path.read_text())
    print(f"-> {path}")
    return 0


def _floats(text: str, flag: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v]
    except ValueError:
        raise ConfigError(f"{flag}: {text!r} is not a comma-separated list of numbers") \
            from None
    if not values:
        raise ConfigError(f"{flag}: {text!r} names nothing")
    return values


def _model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default="resnet50",
                   help=f"catalog: {', '.join(CATALOG)}; with --profile-here a phalanx model "
                        f"(mlp, lenet5, resnet, logreg, gpt, ctr)")
    g.add_argument("--profile-here", action="store_true",
                   help="build the phalanx model and time its step on this machine")
    g.add_argument("--batch", type=int, default=None, help="samples per worker per step")
    g.add_argument("--samples-per-s", type=float, default=None,
                   help="one device's training throughput (overrides the compute source)")


def _cluster_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster (a uniform one grown to fit N, or --cluster YAML)")
    g.add_argument("--cluster", default=None,
                   help="the scheduler's topology YAML with a links: section (docs/scale.md)")
    g.add_argument("--calibration", default=None,
                   help="JSON from 'phalanx scale calibrate': fitted alpha / beta per link")
    g.add_argument("--gpus-per-server", type=int, default=8)
    g.add_argument("--servers-per-rack", type=int, default=32)
    g.add_argument("--nic-gbit", type=float, default=25.0)
    g.add_argument("--intra-gbit", type=float, default=1200.0)
    g.add_argument("--latency-us", type=float, default=10.0, help="per message, NIC level")
    g.add_argument("--oversubscription", type=float, default=1.0, help="rack uplinks")


def _strategy_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("strategy settings")
    g.add_argument("--strategy", default="sync", help=", ".join(STRATEGIES))
    g.add_argument("--servers", type=int, default=1, help="PS shards")
    g.add_argument("--server-placement", default="dedicated", help="dedicated | colocated")
    g.add_argument("--duplex", action="store_true", help="PS pushes and pulls overlap")
    g.add_argument("--allreduce", default="ring", help="ring | tree | hierarchical | main")
    g.add_argument("--bucket-mb", type=float, default=25.0, help="0: no overlap")
    g.add_argument("--fusion-cycle-ms", type=float, default=0.0,
                   help="sync: Horovod's tensor fusion, a bucket closes after this much "
                        "backward or at --bucket-mb (0: buckets by size, as DDP)")
    g.add_argument("--sparse-allreduce", action="store_true",
                   help="sync: the CTR table's distinct rows all-gathered after backward "
                        "(phalanx train --sparse-allreduce), not densified in the buckets")
    g.add_argument("--compress", default="none",
                   help="none | fp16 | bf16 | int8 | topk:F | ratio:R")
    g.add_argument("--period", type=int, default=8, help="average: steps between averages")
    g.add_argument("--staleness", type=int, default=4, help="ssp bound")
    g.add_argument("--softsync", type=int, default=1, help="softsync: pushes per update")
    g.add_argument("--nfetch", type=int, default=1)
    g.add_argument("--npush", type=int, default=1)
    g.add_argument("--stages", type=int, default=0)
    g.add_argument("--micro-batches", type=int, default=4)
    g.add_argument("--tensor", type=int, default=1)
    g.add_argument("--zero-stage", type=int, default=2,
                   help="zero: 1 shards the optimizer state, 2 also gradients, 3 also weights")
    g.add_argument("--stragglers", default="none", help="none | lognormal:SIGMA | slow:K:F")


def register(sub: argparse._SubParsersAction) -> None:
    top = sub.add_parser("scale", help="predict step time, bytes and efficiency of every "
                                       "strategy at 8..4096 workers (a simulator)",
                         description="A training-protocol simulator: workload x collectives "
                                     "x alpha-beta network, plus an event simulation of "
                                     "the asynchronous family. docs/scale.md")
    inner = top.add_subparsers(dest="scale_command", required=True, metavar="ACTION",
                               parser_class=type(top))
    p = inner.add_parser("predict", help="one strategy at one or more N")
    p.add_argument("--workers", default="8,64,512", help="N, comma-separated")
    p.add_argument("--json", action="store_true")
    _model_flags(p), _cluster_flags(p), _strategy_flags(p)
    p.set_defaults(func=_cmd_predict)

    p = inner.add_parser("report", help="every strategy at every N -> CSV, Markdown, PNG")
    p.add_argument("--out", default="runs/scale")
    p.add_argument("--strategies", default=None, help="comma-separated (default: all 14)")
    p.add_argument("--workers", default=None, help="N list (default 8..4096, powers of 2)")
    p.add_argument("--sweep", action="store_true",
                   help="also bandwidth x N x model size -> sweep.csv")
    _model_flags(p), _cluster_flags(p), _strategy_flags(p)
    p.set_defaults(func=_cmd_report)

    p = inner.add_parser("async", help="event simulation of N workers against S shards")
    p.add_argument("--workers", dest="workers_async", type=int, default=64)
    p.add_argument("--steps", type=int, default=100, help="steps per worker")
    p.add_argument("--consistency", default="asp", help=" | ".join(CONSISTENCY))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    _model_flags(p), _cluster_flags(p), _strategy_flags(p)
    p.set_defaults(func=_cmd_async)

    p = inner.add_parser("published", help="the four published results, reproduced")
    p.set_defaults(func=_cmd_published)
    _measuring_actions(inner)


def _measuring_actions(inner: argparse._SubParsersAction) -> None:
    """The actions that run real processes on test hosts (calibrate, bytes) or read their
    runs (validate)."""
    p = inner.add_parser("calibrate", help="fit alpha / beta of shaped links on test hosts "
                                           "(root: network namespaces + tc tbf)")
    p.add_argument("--rates", default="1000,100,20", help="Mbit/s, comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="runs/scale/calibration.json")
    p.add_argument("--no-server", action="store_true",
                   help="skip timing a shard's per-push cost (phalanx.ps ShardState)")
    p.add_argument("--refit", metavar="CALIBRATION_JSON",
                   help="fit an earlier calibration's measurements again (no test hosts)")
    p.set_defaults(func=_cmd_calibrate)

    p = inner.add_parser("validate", help="predict held-out real runs (the bandwidth study's) "
                                          "from a calibration and a fit on N=2")
    p.add_argument("--runs", default="reports/experiments/bandwidth/results.json")
    p.add_argument("--calibration", default="reports/experiments/scale/calibration.json")
    p.add_argument("--out", default=None, help="write the table into this folder")
    p.add_argument("--name", default="validation.md", help="file name in --out")
    p.set_defaults(func=_cmd_validate)

    p = inner.add_parser("bytes", help="every strategy's bytes per step on test hosts (the "
                                       "kernel's counters) against the prediction (root)",
                         description="Runs every strategy on test hosts (one process a "
                         "host) for SHORT and LONG steps and counts each host's tx bytes "
                         "(less TCP's retransmissions) over the extra steps; predicts the "
                         "busiest worker's payload x the bulk framing (+0.25%) + 342 bytes "
                         "a message (gloo's TCP ops). Writes bytes.md and bytes.json. "
                         "docs/scale.md")
    p.add_argument("--models", default="mlp,gpt,ctr", help="mlp, gpt, ctr (comma-separated)")
    p.add_argument("--sizes", default="2,3,4", help="worker counts N, 2..8")
    p.add_argument("--steps", default="4,12",
                   help="SHORT,LONG (LONG - SHORT a multiple of 8): each configuration "
                        "runs twice; the difference is the steady state's bytes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/scale/bytes")
    p.add_argument("--reuse", default=None, metavar="BYTES_JSON",
                   help="predict an earlier run's measurements again, without running (its "
                        "points, steps and cuts; --models, --sizes, --steps are its own)")
    p.set_defaults(func=_cmd_bytes)

    p = inner.add_parser("steps", help="every strategy's step time on shaped test-host links "
                                       "against the prediction, compute fitted at N=2, "
                                       "1000 Mbit/s (root)")
    p.add_argument("--models", default="mlp,gpt,ctr", help="mlp, gpt, ctr (comma-separated)")
    p.add_argument("--sizes", default="2,3", help="worker counts N, 2..8 (must hold 2)")
    p.add_argument("--rates", default="100,20",
                   help="held-out link rates, Mbit/s (1000 among them: held out at N > 2)")
    p.add_argument("--steps", type=int, default=20,
                   help="steps per run, at least (8..10000)")
    p.add_argument("--run-s", type=float, default=2.0,
                   help="size each run to about this many seconds of steps, by the model's "
                        "guess of its step (0: --steps exactly; at most 2000 steps)")
    p.add_argument("--strategies", default=None, metavar="LABEL,...",
                   help="only these strategies, as steps.md names them (e.g. 'zero-3,sync "
                        "main'); default: every one")
    p.add_argument("--tcp", default="",
                   help="TCP congestion control between the test hosts (default: cubic; "
                        "e.g. bbr, this machine's default, to compare: docs/scale.md)")
    p.add_argument("--calibration",
                   default="reports/experiments/scale/calibration-cubic.json")
    p.add_argument("--cores", type=int, default=0,
                   help="cores the runs share (0: this machine's); a step takes at least "
                        "the workers' compute over them")
    p.add_argument("--fit-repeats", type=int, default=3,
                   help="runs of each fit point (N=2, 1000 Mbit/s), spread over its group; "
                        "the median is fitted (1..9)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reuse", default=None, metavar="STEPS_JSON",
                   help="predict an earlier run's measured steps again (another "
                        "--calibration), without running")
    p.add_argument("--across", default=None, metavar="STEPS_JSON,STEPS_JSON,...",
                   help="several reruns' steps.json, each predicted again: how far each "
                        "held-out point moved between them and the model's error against "
                        "their median (across.md, across.json), without running")
    p.add_argument("--out", default="runs/scale/steps")
    p.set_defaults(func=_cmd_steps)
