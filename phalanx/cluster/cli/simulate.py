"""``phalanx simulate``: run the trace-driven cluster simulator.

    phalanx simulate --trace philly --cluster philly-2048 --policy tiresias \\
        --placement topology --out runs/sim
    phalanx simulate --trace pollux:1 --cluster pollux-64 --compare fifo,sjf,las,tiresias
    phalanx simulate --study pollux --out reports/cluster
    phalanx simulate --study load --out reports/cluster
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

from phalanx.cluster.cli import (
    LOAD_ADAPTIVE,
    ROUND_ORDERINGS,
    read_by,
    refuse_unread,
    remember_defaults,
)
from phalanx.cluster.cli.schedule import register as register_schedule
from phalanx.cluster.core.report import Summary, write_jobs_csv, write_plots, write_summary
from phalanx.cluster.policies import ORDERINGS, PLACEMENTS
from phalanx.cluster.policies.catalog import ELASTIC
from phalanx.cluster.policies.goodput import BATCHES, PRIORITIES, PROFILES
from phalanx.cluster.policies.ordering import parse_thresholds
from phalanx.cluster.policies.pollux import SEARCHES
from phalanx.cluster.sim.run import (
    PRESETS,
    SimulateOptions,
    apply_preset,
    check_fits,
    default_data_dir,
    load_inputs,
    make_elastic,
    scaled_interference,
    simulate,
    with_policy,
)
from phalanx.cluster.studies import STUDIES, run_study
from phalanx.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="trace-driven simulation of the cluster scheduler")
    _input_flags(p)
    _policy_flags(p)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--out", default=None, help="output folder")
    _interval_flags(p.add_argument_group("interval engine and presets (docs/cluster.md)"))
    p.set_defaults(func=_cmd_simulate)
    remember_defaults(p)
    register_schedule(sub)


def _input_flags(p: argparse.ArgumentParser) -> None:
    """The trace, the cluster and how the trace is read."""
    p.add_argument("--trace", default="philly",
                   help="philly | pollux:N | sia:philly:N | sia:saturn:N | "
                        "synthetic[:jobs=,rate=,median=,max_gpus=] | a CSV (default philly)")
    p.add_argument("--cluster", default=None,
                   help="philly-2048 | pollux-64 | sia-64 | alibaba | uniform:Z,R,S,G[,SW] | "
                        "a YAML configuration set (default philly-2048; preset "
                        "pollux-artifact: pollux-64; sia-artifact: sia-64)")
    p.add_argument("--data-dir", default=None,
                   help="data folder (default ../shared/data next to the repo)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=0, help="use the first N jobs (0 = all)")
    p.add_argument("--load-scale", type=float, default=1.0,
                   help="divide inter-arrival times by this (more load)")
    p.add_argument("--skip-bad-rows", action="store_true",
                   help="skip malformed trace rows (counted) instead of failing")


def _policy_flags(p: argparse.ArgumentParser) -> None:
    """The policies, their placement options and the perf model's."""
    p.add_argument("--policy", default="fifo",
                   help=f"ordering: {', '.join(ORDERINGS)}; or elastic ({', '.join(ELASTIC)}: "
                        f"GPUs and batch per job, interval engine; pollux = the Pollux "
                        f"artifact's policy; sia, gavel: GPU-type-aware references on a "
                        f"cluster with per-type profiles such as sia-64)")
    p.add_argument("--placement", default=None,
                   help=f"placement: {', '.join(PLACEMENTS)} (default topology; preset "
                        f"pollux-artifact: count)")
    p.add_argument("--compare", default="",
                   help="comma list of orderings (or ORDERING:PLACEMENT) to run on the same "
                        "input; prints one table")
    p.add_argument("--study", choices=STUDIES.names(), default=None,
                   help="; ".join(f"{n}: {STUDIES.help(n)}" for n in STUDIES))
    p.add_argument("--threshold", type=float, default=0.5,
                   help="load-adaptive: spread below this utilisation (default 0.5)")
    p.add_argument("--hysteresis", type=float, default=None,
                   help="load-adaptive: stay in pack mode until the load falls this far below "
                        "the threshold (default 0; load-adaptive-demand 0.2)")
    p.add_argument("--interference-scale", type=float, default=1.0,
                   help="multiply the neighbour-interference weights (0.3 same PCIe switch, "
                        "0.1 same server; default 1)")
    p.add_argument("--slot", type=float, default=2400.0,
                   help="time slot of preemptive policies, seconds (default 2400)")
    p.add_argument("--checkpoint-cost", type=float, default=60.0,
                   help="seconds a preempted job needs to resume (default 60)")
    p.add_argument("--quota", default="", help="admission quota per virtual cluster, "
                                               "e.g. vc1=64,*=128 (default: accept all)")
    p.add_argument("--no-interference", action="store_true",
                   help="turn off PCIe co-location interference in the perf model")
    p.add_argument("--interference-pairs", default=None, metavar="gavel|FILE",
                   help="price each neighbour by its measured pair: 'gavel' (Gavel's "
                        "co-located pairs) or an interference.json from 'phalanx "
                        "interference profile' (default: each model's one sensitivity)")


def _interval_flags(g: argparse._ArgumentGroup) -> None:
    """The interval engine, its presets and the elastic policies' options."""
    g.add_argument("--preset", default=None, choices=PRESETS,
                   help="pollux-artifact: the Pollux artifact's simulator conditions "
                        "(--interval 60 --restart-cost 30 --restart-first yes "
                        "--tiresias-thresholds 57600 --starvation 0 --placement count "
                        "--no-interference --cluster pollux-64); explicit flags win")
    g.add_argument("--interval", type=float, default=None,
                   help="run the interval engine: schedule every S seconds, arrivals and "
                        "completions seen at the boundaries (default: event engine)")
    g.add_argument("--restart-cost", type=float, default=None,
                   help="interval engine: seconds without progress after every allocation "
                        "change (default 30)")
    g.add_argument("--restart-first", choices=("yes", "no"), default=None,
                   help="interval engine: the first start pays the restart cost too "
                        "(default yes)")
    g.add_argument("--tiresias-thresholds", default=None,
                   help="Tiresias queue thresholds, GPU-seconds, comma list (default "
                        "3600,36000)")
    g.add_argument("--starvation", type=float, default=None,
                   help="Tiresias starvation factor, 0 = no promotion (default 4)")
    g.add_argument("--goodput-priority", default=None, choices=PRIORITIES,
                   help="goodput policy: weight of a job's goodput (default none; las: "
                        "1 / (attained GPU-hours + 1); srpt, --profiles oracle only: 1 / "
                        "remaining progress, from the epochs users declare)")
    g.add_argument("--goodput-horizon", type=float, default=None,
                   help="goodput policy: seconds over which a reallocation must pay back "
                        "its restart (default 1800)")
    g.add_argument("--goodput-start", type=int, default=None,
                   help="goodput policy: GPUs (of one node) a job nothing is known of yet "
                        "may start on (default 4; 1 as Pollux and Sia); typed.start")
    g.add_argument("--profiles", default=None, choices=PROFILES,
                   help="what an elastic policy knows of throughput: learned (default: a "
                        "model fitted to the set-ups each job has run, as Pollux) or oracle "
                        "(every measured profile: an ablation, never a headline)")
    g.add_argument("--pollux-generations", type=int, default=None,
                   help="--policy pollux: generations of its genetic search per interval "
                        "(default 30; the artifact runs 100)")
    g.add_argument("--pollux-search", default=None, choices=SEARCHES,
                   help="--policy pollux: its genetic search (ga, default) or a greedy "
                        "search of the same objective")
    g.add_argument("--goodput-batch", default=None, choices=BATCHES,
                   help="goodput policy: choose each job's batch (adaptive, default) or keep "
                        "the trace's (fixed: GPU counts only, an ablation)")


def _options(args: argparse.Namespace) -> SimulateOptions:
    """The flags mapped into the options and their sections (the flags keep their names:
    ``--goodput-priority`` is ``goodput.priority``, ``--pollux-search`` ``pollux.search``)."""
    given: dict[str, object] = dict(
        trace=args.trace, ordering=args.policy, slot_s=args.slot,
        checkpoint_cost_s=args.checkpoint_cost, quota=args.quota,
        data_dir=Path(args.data_dir) if args.data_dir else default_data_dir(),
        seed=args.seed, limit=args.limit, load_scale=args.load_scale,
        skip_bad_rows=args.skip_bad_rows, progress=not args.no_progress,
        placing={"threshold": args.threshold, "hysteresis": args.hysteresis})
    # flags a preset sets: only when given, so that the preset fills the rest
    optional = dict(cluster=args.cluster, placement=args.placement,
                    interval_s=args.interval, restart_cost_s=args.restart_cost,
                    starvation=args.starvation,
                    restart_first=(None if args.restart_first is None
                                   else args.restart_first == "yes"),
                    tiresias_thresholds=(None if args.tiresias_thresholds is None
                                         else parse_thresholds(args.tiresias_thresholds)))
    given.update({k: v for k, v in optional.items() if v is not None})
    sections = {
        "goodput": dict(priority=args.goodput_priority, horizon_s=args.goodput_horizon,
                        batch=args.goodput_batch, profiles=args.profiles),
        "typed": dict(start=args.goodput_start),
        "pollux": dict(generations=args.pollux_generations, search=args.pollux_search),
        "perf": dict(interference=False if args.no_interference else None,
                     pairs=args.interference_pairs)}
    if args.interference_scale != 1.0:
        # the neighbour weights scaled (a preset's "no interference" kept)
        scaled = scaled_interference(args.interference_scale)
        sections["perf"].update(k_switch=scaled.k_switch, k_server=scaled.k_server)
    for key, section in sections.items():
        section = {k: v for k, v in section.items() if v is not None}
        if section:
            given[key] = section
    return SimulateOptions.from_dict(apply_preset(args.preset or "", given))


def _check_read(args: argparse.Namespace, pairs: list[tuple[str, str]]) -> None:
    """A policy flag none of the simulated policies reads is refused (a study runs the
    policies it names, so it is not checked here)."""
    orderings = {o for o, _ in pairs}
    placements = {p for _, p in pairs}
    refuse_unread(args, [
        ("slot", *read_by(orderings, ROUND_ORDERINGS)),
        ("tiresias_thresholds", *read_by(orderings, ("tiresias",))),
        ("starvation", *read_by(orderings, ("tiresias",))),
        ("goodput_priority", *read_by(orderings, ("goodput",))),
        ("goodput_horizon", *read_by(orderings, ("goodput",))),
        ("goodput_start", *read_by(orderings, ("goodput",))),
        ("goodput_batch", *read_by(orderings, ("goodput",))),
        ("profiles", *read_by(orderings, ELASTIC.names())),
        ("pollux_generations", *read_by(orderings, ("pollux",))),
        ("pollux_search", *read_by(orderings, ("pollux",))),
        *((flag, *read_by(placements, LOAD_ADAPTIVE, "--placement"))
          for flag in ("threshold", "hysteresis"))])


def _check_policies(pairs: list[tuple[str, str]]) -> None:
    for o, p in pairs:
        if o not in ORDERINGS and o not in ELASTIC:
            raise ConfigError(f"policy {o!r}: unknown ordering (choose from "
                              f"{', '.join(ORDERINGS)})")
        if p not in PLACEMENTS:
            raise ConfigError(f"placement {p!r}: unknown (choose from {', '.join(PLACEMENTS)})")


def format_table(rows: list[Summary]) -> str:
    head = (f"{'policy':>10s} {'placement':>22s} {'jobs':>6s} {'mean JCT h':>10s} "
            f"{'median h':>9s} {'p99 h':>8s} {'queue h':>8s} {'makespan h':>10s} "
            f"{'util':>5s} {'frag':>5s} {'preempt':>7s} {'wall s':>6s}")
    lines = [head]
    for s in rows:
        lines.append(f"{s.ordering:>10s} {s.placement:>22s} {s.finished:6d} "
                     f"{s.mean_jct_s / 3600:10.3f} {s.median_jct_s / 3600:9.3f} "
                     f"{s.p99_jct_s / 3600:8.2f} {s.mean_queue_delay_s / 3600:8.3f} "
                     f"{s.makespan_s / 3600:10.1f} {s.utilisation_mean:5.2f} "
                     f"{s.fragmentation_mean:5.2f} {s.preemptions:7d} {s.wall_s:6.1f}")
    return "\n".join(lines)


def _out_dir(path: str | None) -> Path | None:
    """Create the output folder up front, so a bad --out fails before the run."""
    if not path:
        return None
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(f"--out {out}: exists and is not a directory") from None
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot create ({e.strerror})") from None
    return out


def _cmd_simulate(args: argparse.Namespace) -> int:
    opts = _options(args)
    if args.study:
        out = _out_dir(args.out or "reports/cluster")
        run_study(args.study, opts, out)
        return 0
    if args.compare:
        pairs = []
        for item in filter(None, args.compare.split(",")):
            o, _, p = item.partition(":")
            pairs.append((o, p or opts.placement))
        if not pairs:
            raise ConfigError(f"--compare {args.compare!r}: names no policy (e.g. "
                              "fifo,sjf,tiresias:topology)")
    else:
        pairs = [(opts.ordering, opts.placement)]
    _check_policies(pairs)
    _check_read(args, pairs)
    inputs = load_inputs(opts)     # a bad trace or cluster leaves no --out folder behind
    out = _out_dir(args.out)
    if inputs.trace.skipped:
        print(f"skipped {inputs.trace.skipped} malformed row(s) of {inputs.trace.source}")
    too_big = check_fits(inputs)
    if too_big:
        print(f"{too_big} job(s) need more GPUs than {inputs.topology.name} can give: "
              f"rejected (status in jobs.csv)")
    # every policy made before the run is announced: one that cannot run on this cluster
    # or these options (sia on one GPU type, interference without a pair table) is its
    # one-line error alone
    runs = []
    for o, p in pairs:
        run = with_policy(opts, o, p)
        runs.append((o, p, run, PLACEMENTS.get(p)(replace(run.placing, co=inputs.perf.co)),
                     make_elastic(run, inputs) if o in ELASTIC else None))
    print(f"simulating {len(inputs.trace.jobs)} jobs of {opts.trace} on {inputs.topology!r}",
          flush=True)
    summaries, results = [], []
    for o, p, run, placement, elastic in runs:
        s, r = simulate(run, inputs, placement=placement, elastic=elastic)
        summaries.append(s)
        results.append((f"{o}/{p}", r))
    print(format_table(summaries))
    if out is not None:
        if len(pairs) == 1:
            write_summary(summaries[0], out / "summary.json")
            write_jobs_csv(results[0][1], out / "jobs.csv")
        else:
            (out / "compare.json").write_text(json.dumps([asdict(s) for s in summaries],
                                                         indent=2) + "\n")
            for (label, r) in results:
                write_jobs_csv(r, out / f"jobs-{label.replace('/', '-')}.csv")
        paths = write_plots(results, out)
        print(f"wrote {out}/ ({', '.join(x.name for x in paths)})")
    return 0
