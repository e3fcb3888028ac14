"""Sub-commands ``phalanx compare`` and ``phalanx experiments list|run``."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

from phalanx.entry.flags import add_run_config_flags, given_config
from phalanx.entry.paths import check_out
from phalanx.errors import ConfigError
from phalanx.experiments import EXPERIMENTS, run_experiment
from phalanx.experiments.compare import compare, parse_strategies
from phalanx.experiments.seeds import pairwise_verdicts, parse_seeds, seeded_table
from phalanx.parallel.registry import check_config
from phalanx.runtime.command_fork import fork_server_from_here


def _cmd_compare(args: argparse.Namespace) -> int:
    strategies = parse_strategies(args.strategies)
    if args.workers is None:
        args.workers = 4
    if args.out is None:
        args.out = "runs/compare"
    base = given_config(args)  # as written: each strategy resolves its own defaults
    check_config(dataclasses.replace(base))  # but every flag is checked now, in one line
    if not 0 < args.target_accuracy <= 1:
        raise ConfigError(f"--target-accuracy: {args.target_accuracy} must be in (0, 1]")
    check_out(base.out)  # before any run: a file, /proc or a read-only folder is one line
    command = "phalanx " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    seeds = parse_seeds(args.seeds, base.seed)
    fork_server_from_here()  # every run's ranks fork from a copy of this process
    runs, report = compare(base, strategies, Path(base.out), target=args.target_accuracy,
                           command=command, seeds=seeds, reuse=args.reuse)
    print(seeded_table(runs, args.target_accuracy))
    verdicts = pairwise_verdicts(runs)
    if verdicts:
        print("\n" + verdicts)
    print(f"\nreport: {report}")
    return 0


def _cmd_experiments(args: argparse.Namespace) -> int:
    if args.action == "list":
        for name, (title, _) in EXPERIMENTS.items():
            print(f"{name:22s} {title}")
        return 0
    if not args.name:
        raise ConfigError("experiments run: name an experiment (see 'phalanx experiments list')")
    if args.name not in EXPERIMENTS:
        raise ConfigError(f"experiments run: {args.name!r} is not one of {', '.join(EXPERIMENTS)}")
    out = check_out(args.out or f"runs/experiments/{args.name}")
    fork_server_from_here()
    report = run_experiment(args.name, out, quick=args.quick, data=args.data,
                            seeds=parse_seeds(args.seeds, args.seed), reuse=args.reuse)
    print(Path(report).read_text())
    print(f"report: {report}")
    return 0


_SEEDS_HELP = ("repeat every run over seeds: a count K (seeds --seed .. --seed+K-1) or a comma "
               "list, e.g. 0,1,2; tables then show mean +- sd and 95%% intervals")


COMPARE_SKIPS = ("strategy", "resume", "overwrite", "kill_worker", "kill_server")
_REUSE_HELP = ("read back finished runs of the same configuration in the report folder instead "
               "of running them again (add seeds, finish a cut-off study)")


def register(sub) -> None:
    p = sub.add_parser("compare", help="run several strategies on the same job; write a report")
    p.add_argument("--strategies", required=True,
                   help="comma list, e.g. single,sync,asp,ssp,dc-asgd")
    p.add_argument("--target-accuracy", type=float, default=0.8,
                   help="report time and samples to reach this test accuracy (default 0.8)")
    # compare picks the strategies and owns its run folders: the flags of one run that say
    # otherwise are not offered
    p.usage = ("phalanx compare --strategies A,B[,...] [--seeds K] [--target-accuracy X] "
               "[--config FILE] [--SETTING VALUE ...]")
    add_run_config_flags(p, skip=COMPARE_SKIPS)
    p.add_argument("--seeds", default=None, help=_SEEDS_HELP)
    p.add_argument("--reuse", action="store_true", help=_REUSE_HELP)
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser("experiments", help="the literature's claims as reproducible studies")
    p.add_argument("action", choices=["list", "run"])
    p.add_argument("name", nargs="?", metavar="NAME",
                   help="the experiment to run: " + ", ".join(EXPERIMENTS)
                   + " ('phalanx experiments list' gives each one's claim)")
    p.add_argument("--quick", action="store_true", help="a small version (CI-sized)")
    p.add_argument("--data", default=None, help="data set (default: fashion-mnist; quick: "
                   "synthetic)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="report folder (default runs/experiments/NAME)")
    p.add_argument("--seeds", default=None, help=_SEEDS_HELP)
    p.add_argument("--reuse", action="store_true", help=_REUSE_HELP)
    p.set_defaults(func=_cmd_experiments)
