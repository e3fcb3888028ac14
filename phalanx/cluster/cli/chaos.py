"""``phalanx chaos``: a live schedule of short real jobs under random, seeded faults, and
the invariants checked after each run (docs/faults.md, "Chaos: random faults under load").

    phalanx chaos --seed 0 --runs 10 --faults 20 --jobs 24 --out runs/chaos
    phalanx chaos --kinds kill-rank,stop-rank --faults 4 --jobs 8
    phalanx chaos --engine ray --seed 200 --runs 10 --faults 20 --jobs 12 --out runs/chaos-ray
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from phalanx.cluster.chaos.faults import ENGINE_KINDS
from phalanx.cluster.chaos.harness import run
from phalanx.cluster.chaos.options import ENGINES, ChaosOptions, parse_kinds
from phalanx.cluster.chaos.raycluster import unavailable
from phalanx.cluster.chaos.report import write
from phalanx.errors import ConfigError

HELP = ("run a live schedule of short real jobs under random, seeded faults and check its "
        "invariants")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chaos", help=HELP, description=HELP + " (the disk-full fault mounts a "
                       "tmpfs and needs root; --engine ray makes three test hosts, network "
                       "namespaces, and needs root too). Exit 1 when an invariant is "
                       "violated.")
    p.add_argument("--engine", default="local", choices=ENGINES,
                   help="local: this machine's 4 slots; ray: a Ray cluster of three test "
                        "hosts (ray start per host), the scheduler in host 0 (default local)")
    p.add_argument("--seed", type=int, default=0, help="the first run's seed (default 0)")
    p.add_argument("--runs", type=int, default=1,
                   help="runs, one per seed from --seed on (default 1)")
    p.add_argument("--faults", type=int, default=12, help="faults per run (default 12)")
    p.add_argument("--jobs", type=int, default=24,
                   help="jobs per run: the mix of sync, sync+PowerSGD, asp, ssp, pipeline, a "
                        "GPT and a click model, in turn (default 24)")
    p.add_argument("--kinds", default="all",
                   help=f"fault kinds: all (default; disk-full only as root) or a comma list: "
                        f"local {', '.join(ENGINE_KINDS['local'])}; ray "
                        f"{', '.join(ENGINE_KINDS['ray'])}")
    p.add_argument("--window", type=float, default=0.0,
                   help="faults fall in [1, WINDOW] s after the schedule starts (default: "
                        "4 + 1.6 x --jobs; 4 + 5 x --jobs on ray)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="a run whose schedule has not ended after this many seconds fails "
                        "(default 600)")
    p.add_argument("--out", default="runs/chaos", help="output folder (default runs/chaos)")
    p.set_defaults(func=_cmd, interrupt_hint="; the run's folder holds what it did so far")


def _cmd(args: argparse.Namespace) -> int:
    opts = ChaosOptions(out=Path(args.out), seed=args.seed, runs=args.runs,
                        faults=args.faults, jobs=args.jobs,
                        kinds=parse_kinds(args.kinds, args.engine), window_s=args.window,
                        timeout_s=args.timeout, engine=args.engine)
    why = unavailable() if opts.engine == "ray" else None
    if why is not None:
        raise ConfigError(f"--engine ray: {why}")
    results = run(opts, say=lambda line: print(line, flush=True))
    sys.stdout.write(write(results, opts.out))
    return 1 if any(r.violated for r in results) else 0
