"""``phalanx schedule``'s run: the flags checked against each other, the cluster and the job
list, then the live engine (local, Ray, Slurm) driven by the chosen policy. Imported when a
schedule runs (``schedule.py`` builds the flags without it: it imports torch)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from phalanx.cluster.cli import given
from phalanx.cluster.core.cadence import Cadence
from phalanx.cluster.core.clusters import default_data_dir, resolve_cluster
from phalanx.cluster.core.report import summarise, write_jobs_csv, write_plots, write_summary
from phalanx.cluster.core.result import SimResult
from phalanx.cluster.live.colocation import LiveCoLocation, learn, observe
from phalanx.cluster.live.config import LiveConfig
from phalanx.cluster.live.elastic import ElasticLiveCluster
from phalanx.cluster.live.engines import ENGINES
from phalanx.cluster.live.engines.base import EngineOptions
from phalanx.cluster.live.joblist import (
    LiveJob,
    check_fits,
    check_profiles,
    check_settings,
    load_job_list,
)
from phalanx.cluster.live.loop import LiveCluster
from phalanx.cluster.live.state import STATE_FILE, unfinished
from phalanx.cluster.live.state import load as load_state
from phalanx.cluster.model.core_share import CoreShare
from phalanx.cluster.model.interference import kind_of, load_pairs
from phalanx.cluster.policies import make_ordering, make_placement
from phalanx.cluster.policies.catalog import ELASTIC
from phalanx.cluster.policies.goodput_typed import TypedOptions
from phalanx.cluster.policies.ordering import parse_thresholds
from phalanx.dashboard.beside import serve_beside
from phalanx.dashboard.serve import check_port
from phalanx.errors import ConfigError
from phalanx.parallel import registry
from phalanx.runtime.command_fork import fork_server_from_here
from phalanx.runtime.supervise import preload


def run_schedule(args: argparse.Namespace) -> int:
    """Check the cluster and the job list (the flags are checked before this module is
    imported: :func:`schedule.check_flags`), then run the schedule."""
    if args.dashboard is not None:
        check_port(args.dashboard, "--dashboard")
    cadence = Cadence(args.interval, args.restart_cost)
    thresholds = (parse_thresholds(args.tiresias_thresholds) if args.tiresias_thresholds
                  else None)
    elastic = args.policy in ELASTIC
    ordering = make_ordering("fifo" if elastic else args.policy, args.slot,
                             thresholds, args.starvation)
    if args.resume and given(args, "out") and Path(args.out).absolute() != Path(
            args.resume).absolute():
        raise ConfigError(f"--out {args.out}: --resume {args.resume} writes to its own folder; "
                          "drop --out")
    topology = resolve_cluster(args.cluster, default_data_dir())
    jobs = load_job_list(args.jobs)
    kinds = {j.spec.name: kind_of(j.spec.model, j.spec.kind) for j in jobs}
    # an existing cluster's servers are machines of their own: a job across them sends
    # over their links (level link); a cluster started here is this machine (loopback)
    links = bool(args.ray_address or args.slurm_partition)
    # the table given, refined by what this schedule measures as it runs
    co = (LiveCoLocation(load_pairs(args.interference_pairs, default_data_dir()),
                         Path(args.resume or args.out).absolute(), topology, kinds,
                         links=links)
          if args.interference_pairs else None)
    placement = make_placement(args.placement, args.threshold, args.hysteresis, co)
    config = LiveConfig(Path(args.resume or args.out).absolute(), poll_s=args.poll,
                        job_timeout_s=args.job_timeout,
                        grace_s=args.grace, max_job_restarts=args.max_job_restarts,
                        lost_wait_s=args.lost_wait)
    check_fits(jobs, topology, args.jobs)  # the cheap check first
    check_profiles(jobs, topology, args.jobs, elastic and topology.typed)
    if args.engine == "local" and config.python == sys.executable:
        _fork_server_for(jobs)
    check_settings(jobs, args.jobs)
    out = config.out
    saved = load_state(out, jobs, topology, args.jobs) if args.resume else None
    if saved is None and unfinished(out):
        raise ConfigError(f"--out {out}: holds the {STATE_FILE} of a schedule that did not "
                          f"end; continue it with --resume {out}, or choose another --out")
    if saved is not None and saved.finished:
        print(f"{out}: every job of this schedule already ended; nothing to resume",
              flush=True)
        return 0
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError:
        raise ConfigError(f"--out {out}: cannot create a folder there") from None
    with contextlib.ExitStack() as stack:
        if args.dashboard is not None:
            stack.callback(serve_beside(out, topology, [(j.spec.name, j.spec.submit)
                                                        for j in jobs], args.dashboard).stop)
        # the engine's executor; a cluster it starts here is stopped when ``stack`` closes
        executor = ENGINES.get(args.engine)(topology, EngineOptions(
            python=config.python, ray_address=args.ray_address,
            slurm_partition=args.slurm_partition, pin_cores=args.pin_cores), stack)
        if elastic:
            # a cluster started here has this machine's cores under every server; an
            # existing one has the cores its topology declares per server
            cores = (CoreShare.per_server(topology)
                     if args.ray_address or args.slurm_partition
                     else CoreShare.this_machine(topology))
            typed = (TypedOptions() if args.goodput_start is None
                     else TypedOptions(start=args.goodput_start))
            live = ElasticLiveCluster(topology, jobs, placement, config, cadence,
                                      args.goodput_horizon, executor, cores, resume=saved,
                                      policy=args.policy, typed=typed)
            for job in live.jobs:
                why = live.why_fixed[job.spec.id]
                if why:
                    print(f"  {job.spec.name}: runs at its {job.spec.gpus} GPU(s), not "
                          f"resized: {why}")
        else:
            live = LiveCluster(topology, jobs, ordering, placement, config, executor=executor,
                               resume=saved)
        if saved is not None:
            status = [j.status for j in saved.jobs.values()]
            print(f"resuming {out} at {saved.clock:.1f} s: {status.count('done')} job(s) "
                  f"ended, {status.count('waiting')} waiting, {status.count('running')} were "
                  "running", flush=True)
        print(f"scheduling {len(jobs)} job(s) from {args.jobs} on {topology.num_devices} "
              f"device(s), engine {args.engine} ({args.policy}, {placement.name})", flush=True)
        res = live.run()
    _report(args, res, placement.name, topology.name, out)
    learned = learn(observe(out, topology, kinds, links=links), kinds,
                    f"learned from the live schedule {out} ({args.placement})")
    if learned is not None:
        learned.save(out / "interference-learned.json")
        print(f"measured {len(learned.pairs)} co-located pair(s) of job classes: "
              f"{out}/interference-learned.json")
    return 0


def _fork_server_for(jobs: list[LiveJob]) -> None:
    """The local engine's torchrun-style ranks fork from a copy of this process, made now
    (before it reads data), with what they import already imported."""
    names = {str(j.config.get("strategy")) for j in jobs} & set(registry.NAMES)
    preload("phalanx.entry.forked_rank",
            *(m for name in sorted(names) for m in registry.spec(name).preload))
    fork_server_from_here()


def _report(args: argparse.Namespace, res: SimResult, placement: str, cluster: str,
            out: Path) -> None:
    """summary.json, jobs.csv, the plots, and a line per job."""
    summary = summarise(res, args.policy, placement, cluster, str(args.jobs))
    write_summary(summary, out / "summary.json")
    write_jobs_csv(res, out / "jobs.csv")
    write_plots([(f"{args.policy}/{placement}", res)], out)
    for st in res.jobs:
        status = f"failed ({st.failure})" if st.failure else (
            "finished" if st.end >= 0 else "never started")
        print(f"  {st.spec.name:20s} gpus {st.spec.gpus}  start {st.start:7.2f} s  "
              f"end {st.end:7.2f} s  preempted {st.preemptions}  {status}")
    for spec, reason in res.rejected:
        print(f"  {spec.name:20s} rejected: {reason}")
    print(f"{summary.finished} finished, {summary.failed} failed, {summary.rejected} rejected; "
          f"wrote {out}/ (summary.json, jobs.csv, jobs/, logs/, ranks/)")
