"""``phalanx schedule``: live mode — run a job list of real training runs on local slots
with the simulator's policies.

    phalanx schedule --jobs jobs.yaml --cluster uniform:1,1,2,2 --policy fifo \\
        --placement pack --out runs/schedule
"""

from __future__ import annotations

import argparse
from pathlib import Path

from phalanx.cluster.clusters import resolve_cluster
from phalanx.cluster.joblist import check_fits, check_settings, load_job_list
from phalanx.cluster.live import LiveCluster, LiveConfig
from phalanx.cluster.policies import ORDERINGS, PLACEMENTS, make_ordering, make_placement
from phalanx.cluster.report import summarise, write_jobs_csv, write_plots, write_summary
from phalanx.cluster.run import default_data_dir
from phalanx.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schedule", help="live mode: run a job list of phalanx training runs "
                                        "on local slots with a scheduling policy")
    p.add_argument("--jobs", required=True,
                   help="job list (.yaml or .csv): name, arrival (s), gpus (gang size = "
                        "workers), training settings")
    p.add_argument("--cluster", default="uniform:1,1,1,2",
                   help="slots as a topology: uniform:Z,R,S,G (each device is one local slot) "
                        "or a YAML configuration set (default uniform:1,1,1,2 = 2 slots)")
    p.add_argument("--policy", default="fifo",
                   help="ordering: fifo or sjf (time-sliced policies need preemption, "
                        "which live mode does not do)")
    p.add_argument("--placement", default="pack", help=f"placement: {', '.join(PLACEMENTS)}")
    p.add_argument("--threshold", type=float, default=0.5, help="load-adaptive threshold")
    p.add_argument("--hysteresis", type=float, default=None, help="load-adaptive hysteresis")
    p.add_argument("--job-timeout", type=float, default=0.0,
                   help="kill a job that runs longer than this many seconds (0 = never)")
    p.add_argument("--poll", type=float, default=0.05,
                   help="seconds between checks for exits and arrivals (default 0.05)")
    p.add_argument("--out", default="runs/schedule", help="output folder")
    p.set_defaults(func=_cmd_schedule)


def _cmd_schedule(args: argparse.Namespace) -> int:
    if args.policy not in ORDERINGS:
        raise ConfigError(f"--policy {args.policy}: unknown (choose from fifo, sjf)")
    ordering = make_ordering(args.policy)
    placement = make_placement(args.placement, args.threshold, args.hysteresis)
    config = LiveConfig(Path(args.out), poll_s=args.poll, job_timeout_s=args.job_timeout)
    topology = resolve_cluster(args.cluster, default_data_dir())
    jobs = load_job_list(args.jobs)
    check_settings(jobs, args.jobs)
    check_fits(jobs, topology, args.jobs)
    live = LiveCluster(topology, jobs, ordering, placement, config)
    out = config.out
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError:
        raise ConfigError(f"--out {out}: cannot create a folder there") from None
    print(f"scheduling {len(jobs)} job(s) from {args.jobs} on {topology.num_devices} slot(s) "
          f"({args.policy}, {placement.name})", flush=True)
    res = live.run()
    summary = summarise(res, args.policy, placement.name, topology.name, str(args.jobs))
    write_summary(summary, out / "summary.json")
    write_jobs_csv(res, out / "jobs.csv")
    write_plots([(f"{args.policy}/{placement.name}", res)], out)
    for st in res.jobs:
        status = f"failed ({st.failure})" if st.failure else (
            "finished" if st.end >= 0 else "never started")
        print(f"  {st.spec.name:20s} gpus {st.spec.gpus}  start {st.start:7.2f} s  "
              f"end {st.end:7.2f} s  {status}")
    for spec, reason in res.rejected:
        print(f"  {spec.name:20s} rejected: {reason}")
    print(f"{summary.finished} finished, {summary.failed} failed, {summary.rejected} rejected; "
          f"wrote {out}/ (summary.json, jobs.csv, jobs/, logs/)")
    return 0
