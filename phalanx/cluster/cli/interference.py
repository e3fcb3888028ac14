"""``phalanx interference profile``: measure how much of its solo rate each job class keeps
beside another on this machine, per sharing level (docs/cluster.md, "Interference profile").

    phalanx interference profile                               # every class, both levels
    phalanx interference profile --classes mlp-single-1,gpt-single-1 --levels core \\
        --seconds 3 --repeats 1 --out /tmp/interference
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from phalanx.cluster.studies.interference import (
    CLASSES,
    DEFAULT_LEVELS,
    LINK_RATE_MBIT,
    Host,
    ProfileOptions,
    profile,
)
from phalanx.errors import ConfigError
from phalanx.runtime.hosts import TestNetwork, unavailable

HELP = ("measure how much of its solo rate each job class keeps beside another on this "
        "machine (real jobs pinned to cores)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("interference", help=HELP,
                       description="Pairwise interference of phalanx job classes on this "
                                   "machine: real `phalanx train` jobs pinned to cores.")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = actions.add_parser(
        "profile", help="run the jobs and write interference.json and interference.md",
        description="For each pair of job classes (a class with itself too) at each level: "
                    "each job's solo rate (alone on the first usable core), then both side "
                    "by side; kept = rate beside / solo. Writes OUT/interference.json and "
                    "OUT/interference.md.")
    q.add_argument("--classes", default="",
                   help="comma list of job classes (default: all but gpt-sync-2; at level "
                        "link alone: mlp-single-1,mlp-sync-2,ctr-ps-1,gpt-sync-2): "
                        + "; ".join(
                       f"{n}: {CLASSES.help(n)}" for n in CLASSES))
    q.add_argument("--pairs", default="",
                   help="comma list of CLASS:CLASS: only these pairs (of --classes), e.g. "
                        "to measure one cell again (default: every pair of --classes, a "
                        "class with itself included)")
    q.add_argument("--levels", default=",".join(DEFAULT_LEVELS),
                   help="comma list: core (both jobs pinned to one core), server (one core "
                        "each; needs 2 usable cores), link (2 test hosts, one core each, "
                        "joined by a link shaped to --link-rate; a class of several "
                        "processes runs across them; needs root for ip/tc) (default "
                        "core,server; classes by default at link alone: "
                        "mlp-single-1,mlp-sync-2,ctr-ps-1,gpt-sync-2)")
    q.add_argument("--link-rate", type=float, default=None,
                   help="level link: the test hosts' link in Mbit/s, both directions (tc "
                        f"tbf) (default {LINK_RATE_MBIT:g})")
    q.add_argument("--seconds", type=float, default=10.0,
                   help="the measured window of each measurement, after warm-up (default 10)")
    q.add_argument("--repeats", type=int, default=3,
                   help="measurements of each pair (and of the solo rates before it); the "
                        "table holds the median and the min..max (default 3)")
    q.add_argument("--warmup-steps", type=int, default=20,
                   help="steps every rank of a job logs before the window opens (default 20)")
    q.add_argument("--startup-timeout", type=float, default=180.0,
                   help="seconds a measurement's jobs may take to warm up (default 180)")
    q.add_argument("--grace", type=float, default=10.0,
                   help="seconds between SIGTERM and SIGKILL when a job is stopped "
                        "(default 10)")
    q.add_argument("--out", default="reports/cluster/interference",
                   help="output folder (default reports/cluster/interference)")
    q.set_defaults(func=_cmd_profile,
                   interrupt_hint="; the profile wrote nothing")


def _cmd_profile(args: argparse.Namespace) -> int:
    rate = LINK_RATE_MBIT if args.link_rate is None else args.link_rate
    opts = ProfileOptions.parse(classes=args.classes, pairs=args.pairs, levels=args.levels,
                                link_rate=rate, seconds=args.seconds,
                                repeats=args.repeats, warmup_steps=args.warmup_steps,
                                startup_timeout_s=args.startup_timeout, grace_s=args.grace)
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if "link" not in opts.levels:
        if args.link_rate is not None:
            raise ConfigError("--link-rate: only level link uses it (add link to --levels)")
        profile(opts, Path(args.out), say)
        return 0
    why = unavailable()
    if why:
        raise ConfigError(f"--levels link: cannot make test hosts here: {why}")
    # two test hosts whose link is shaped to --link-rate, torn down whatever happens
    with TestNetwork(2, rate_mbit=opts.link_rate) as net:
        profile(opts, Path(args.out), say,
                hosts=[Host(tuple(h.argv([])), h.addr, h.iface) for h in net.hosts])
    return 0
