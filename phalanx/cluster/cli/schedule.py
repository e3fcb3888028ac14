"""``phalanx schedule``: live mode — run a job list of real training runs with the
simulator's policies, on local slots, a Ray cluster or a Slurm cluster.

    phalanx schedule --jobs jobs.yaml --cluster uniform:1,1,2,2 --policy fifo \\
        --placement pack --out runs/schedule
    phalanx schedule --jobs jobs.yaml --cluster uniform:1,2,2,2 --policy tiresias \\
        --slot 20 --tiresias-thresholds 30 --engine ray          # a local 4-node Ray cluster
    phalanx schedule ... --engine ray --ray-address HEAD:6379    # an existing Ray cluster
    phalanx schedule ... --engine slurm                          # a local Slurm cluster (root)
    phalanx schedule ... --engine slurm --slurm-partition gpu    # an existing Slurm cluster
    phalanx schedule --jobs jobs.yaml ... --resume runs/schedule # continue a killed schedule
"""

from __future__ import annotations

import argparse

from phalanx.cluster.cli import (
    LOAD_ADAPTIVE,
    ROUND_ORDERINGS,
    read_by,
    refuse_unread,
    remember_defaults,
)
from phalanx.cluster.live.engines import ENGINES
from phalanx.cluster.policies import ORDERINGS, PLACEMENTS
from phalanx.cluster.policies.catalog import ELASTIC
from phalanx.cluster.policies.goodput_typed import TypedOptions
from phalanx.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schedule", help="live mode: run a job list of phalanx training runs "
                                        "on local slots, a Ray or a Slurm cluster with a "
                                        "scheduling policy")
    p.add_argument("--jobs", required=True,
                   help="job list (.yaml or .csv): name, arrival (s), gpus (gang size = "
                        "workers), training settings")
    p.add_argument("--cluster", default="uniform:1,1,1,2",
                   help="the devices as a topology: uniform:Z,R,S,G or a YAML configuration "
                        "set (default uniform:1,1,1,2 = 2 devices on one server)")
    p.add_argument("--engine", default="local", choices=ENGINES.names(),
                   help="local: every device is a slot on this machine; ray: one Ray node "
                        "per server; slurm: one Slurm node per server (default local)")
    p.add_argument("--ray-address", default="",
                   help="with --engine ray: an existing cluster's address (HOST:PORT); "
                        "without it a local Ray cluster is built from --cluster")
    p.add_argument("--slurm-partition", default="",
                   help="with --engine slurm: a partition of an existing Slurm cluster (found "
                        "through SLURM_CONF as Slurm's commands find it); without it a local "
                        "Slurm cluster is built from --cluster (root)")
    p.add_argument("--policy", default="fifo",
                   help=f"ordering: {', '.join(ORDERINGS)}; or elastic, the simulator's "
                        f"catalog ({', '.join(ELASTIC)}: resizes sync, average and "
                        "parameter-server jobs every --interval; sia on a cluster with "
                        "device types; gavel needs measured per-type profiles, which a job "
                        "list does not give)")
    p.add_argument("--interval", type=float, default=60.0,
                   help="elastic policies: seconds between allocations (default 60)")
    p.add_argument("--restart-cost", type=float, default=30.0,
                   help="elastic policies: seconds a resize is assumed to cost (default 30)")
    p.add_argument("--goodput-horizon", type=float, default=1800.0,
                   help="goodput: a resize must pay its restart back within this many "
                        "seconds (default 1800)")
    p.add_argument("--goodput-start", type=int, default=None,
                   help="goodput: GPUs (of one node) a job nothing is known of yet may "
                        "start on (default 4; 1 as Pollux and Sia)")
    p.add_argument("--placement", default="pack", help=f"placement: {', '.join(PLACEMENTS)}")
    p.add_argument("--interference-pairs", default="", metavar="FILE",
                   help="--placement interference: the pair table it weighs (an "
                        "interference.json from 'phalanx interference profile', or gavel)")
    p.add_argument("--pin-cores", action="store_true",
                   help="local engine: pin each PCIe switch's slots to one core of this "
                        "machine (jobs on one switch share a core; see docs/cluster.md)")
    p.add_argument("--slot", type=float, default=60.0,
                   help="seconds between rounds of a time-sliced policy (las, tiresias, rr; "
                        "default 60)")
    p.add_argument("--tiresias-thresholds", default="",
                   help="Tiresias queue thresholds in GPU-seconds, comma list "
                        "(default 3600,36000)")
    p.add_argument("--starvation", type=float, default=None,
                   help="Tiresias starvation factor, 0 = no promotion (default 4)")
    p.add_argument("--grace", type=float, default=30.0,
                   help="seconds a stopped job has to checkpoint before SIGKILL (default 30)")
    p.add_argument("--threshold", type=float, default=0.5, help="load-adaptive threshold")
    p.add_argument("--hysteresis", type=float, default=None, help="load-adaptive hysteresis")
    p.add_argument("--job-timeout", type=float, default=0.0,
                   help="stop a job that runs longer than this many seconds (0 = never)")
    p.add_argument("--max-job-restarts", type=int, default=1,
                   help="a job whose rank dies or cannot join its group starts again this "
                        "many times, then fails with one line naming the rank (default 1)")
    p.add_argument("--lost-wait", type=float, default=600.0, metavar="S",
                   help="when only lost servers keep waiting jobs from running, wait this "
                        "many seconds for them to come back, then fail those jobs "
                        "(default 600)")
    p.add_argument("--poll", type=float, default=0.05,
                   help="seconds between checks for exits and arrivals (default 0.05)")
    p.add_argument("--out", default="runs/schedule", help="output folder")
    p.add_argument("--resume", default="", metavar="OUT",
                   help="continue the schedule whose --out is OUT after its scheduler died "
                        "(the same --jobs and --cluster): finished jobs are not run again, "
                        "the others resume from their checkpoints")
    p.add_argument("--dashboard", type=int, default=None, metavar="PORT",
                   help="serve the read-only dashboard of --out on 127.0.0.1:PORT while the "
                        "schedule runs (0: any free port; docs/dashboard.md)")
    p.set_defaults(func=_cmd_schedule)
    remember_defaults(p)


def check_flags(args: argparse.Namespace) -> None:
    """The flags alone, before the engines and the training side are imported: an unknown
    policy, an engine's option given for another engine, a flag the chosen policy or
    placement does not read."""
    if args.policy not in ORDERINGS and args.policy not in ELASTIC:
        raise ConfigError(f"--policy {args.policy}: unknown (choose from "
                          f"{', '.join(ORDERINGS)}, {', '.join(ELASTIC)})")
    if args.ray_address and args.engine != "ray":
        raise ConfigError("--ray-address: only with --engine ray")
    if args.slurm_partition and args.engine != "slurm":
        raise ConfigError("--slurm-partition: only with --engine slurm")
    if args.pin_cores and args.engine != "local":
        raise ConfigError("--pin-cores: only with --engine local (this machine's cores)")
    if args.placement == "interference" and not args.interference_pairs:
        raise ConfigError("--placement interference weighs measured pairs: give "
                          "--interference-pairs FILE (phalanx interference profile) or gavel")
    if args.goodput_start is not None:
        TypedOptions(start=args.goodput_start)   # the section checks the flag itself
    policy, placement = {args.policy}, {args.placement}
    elastic = (read_by(policy, ELASTIC.names())[0],
               f"--policy {args.policy} does not use it (only {', '.join(ELASTIC)}: their "
               "round)")
    goodput = (read_by(policy, ("goodput",))[0],
               f"--policy {args.policy} does not use it (only goodput)")
    refuse_unread(args, [
        ("interval", *elastic), ("restart_cost", *elastic), ("goodput_horizon", *goodput),
        ("goodput_start", *goodput),
        ("slot", *read_by(policy, ROUND_ORDERINGS)),
        ("tiresias_thresholds", *read_by(policy, ("tiresias",))),
        ("starvation", *read_by(policy, ("tiresias",))),
        *((flag, *read_by(placement, LOAD_ADAPTIVE, "--placement"))
          for flag in ("threshold", "hysteresis")),
        ("interference_pairs", *read_by(placement, ("interference",), "--placement"))])


def _cmd_schedule(args: argparse.Namespace) -> int:
    # the live engines, the job list's checks and the training side (torch) are imported
    # when a schedule runs, not when the command's flags are built (``--help``)
    check_flags(args)
    from phalanx.cluster.cli.schedule_run import run_schedule

    return run_schedule(args)
