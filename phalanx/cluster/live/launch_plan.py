"""How a live job runs: one process per rank or one driver, whether it can be preempted,
and the command and rank slots of each start (:class:`~phalanx.cluster.live.engines.base.Gang`).

* **Ranks** when the strategy runs under ``torchrun`` (a ``process_main``) with one rank
  per device (``world_size == gpus``: sync, average). Each rank gets exactly one device of
  the placement, in device order, so a 2-server gang is 2 nodes' ranks.
* **Driver** otherwise: ``phalanx train`` on the node of the gang's first device, holding
  that node's devices of the gang (the parameter server's shards and a single process
  cannot be split over nodes by the scheduler).

Preemptible: the strategy can resume (``StrategySpec.can_resume``) and a stop loses
nothing it cannot redo: ranks checkpoint on SIGTERM (sync, average); a driver needs
``checkpoint_every``: a parameter server's shards then write their state on the SIGTERM
(it reaches the driver's whole process group), other drivers' ranks die with it and
resume from their last periodic checkpoint.
Everything else is non-preemptible: the policy keeps it running once started, and
``jobs.csv`` says why.

Emulated device types (a type's ``slowdown`` in the topology, for CPU machines): every
compute rank of a gang on such a type runs ``--slow-workers R:slowdown`` (the straggler
emulation: each compute phase is followed by a sleep of (slowdown - 1) times its length).
A fresh start gets the flag; a resumed one has its run folder's ``config.json`` rewritten
(``slow_workers`` is no part of the trajectory, so the checkpoint still matches), since
``--resume`` takes every setting from there.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from phalanx.cluster.core.topology import Topology
from phalanx.cluster.live.engines.base import Gang, RankSlot
from phalanx.cluster.live.joblist import LiveJob, gang_settings, slow_ranks
from phalanx.config import RunConfig
from phalanx.parallel.registry import spec


@dataclass(frozen=True)
class JobPlan:
    """How a job's gang starts: as ranks (one process per device) or as one driver; whether
    it can be preempted, and why not."""

    per_rank: bool
    preemptible: bool
    why_not: str = ""          # why a job is not preemptible ('' when it is)
    strategy: str = ""


def plan_of(job: LiveJob) -> JobPlan:
    cfg = RunConfig.from_mapping(gang_settings(job.config, job.spec.gpus),
                                 source=f"job {job.spec.name}")
    s = spec(cfg.strategy)
    per_rank = s.process_main is not None and s.world_size(cfg) == job.spec.gpus
    if s.check_resume is None:
        return JobPlan(per_rank, False, f"--strategy {cfg.strategy} cannot resume", s.name)
    if not per_rank and cfg.checkpoint_every == 0:
        return JobPlan(per_rank, False, "no periodic checkpoint (set checkpoint_every)", s.name)
    return JobPlan(per_rank, True, "", s.name)


def resumable(job: LiveJob, run_dir: Path) -> bool:
    """A stopped job's folder holds what its strategy resumes from (else it starts anew:
    it was stopped before its first checkpoint)."""
    if not (run_dir / "config.json").is_file():
        return False
    cfg = RunConfig.from_mapping({**gang_settings(job.config, job.spec.gpus),
                                  "out": str(run_dir)},
                                 source=f"job {job.spec.name}")
    can = spec(cfg.strategy).can_restart
    return can is not None and can(cfg)


def sweep_dead_writers(run_dir: Path) -> list[str]:
    """Remove the temp files (``.NAME.tmpPID``, :func:`phalanx.runtime.checkpoint.
    save_checkpoint`'s) that a writer killed mid-write left in a run folder, before the
    job starts again: a SIGKILL gives the writer no chance to (found by the chaos harness:
    a shard killed while it wrote ``ps_shard0.ckpt``). A live writer's are left alone."""
    removed = []
    for path in run_dir.glob(".*.tmp*"):
        pid = path.name.rsplit(".tmp", 1)[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def emulate_type(run_dir: Path, slowdown: float) -> None:
    """Rewrite a stopped run's ``config.json`` so that its resume computes ``slowdown``
    times slower on every compute rank (1: at full speed)."""
    path = run_dir / "config.json"
    values = json.loads(path.read_text())
    cfg = RunConfig.from_mapping(values, source=str(path))
    values["slow_workers"] = {str(r): f for r, f in slow_ranks(cfg, slowdown).items()}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(values, indent=2) + "\n")
    os.replace(tmp, path)


def rank_slots(topology: Topology, devices: tuple[int, ...], per_rank: bool
               ) -> tuple[RankSlot, ...]:
    """One slot per device (ranks), or one slot with the first server's devices (driver)."""
    t = topology
    devs = sorted(devices)

    def slot(rank: int, ds: list[int]) -> RankSlot:
        server = t.servers[t.device_server[ds[0]]]
        return RankSlot(rank, server.index, server.name, tuple(ds),
                        tuple(d - server.first_device for d in ds))

    if per_rank:
        return tuple(slot(r, [d]) for r, d in enumerate(devs))
    first = t.device_server[devs[0]]
    return (slot(0, [d for d in devs if t.device_server[d] == first]),)


def build_gang(job: LiveJob, plan: JobPlan, topology: Topology, devices: tuple[int, ...],
               start: int, out: Path, resume: bool, workers: int | None = None,
               slowdown: float | None = None) -> Gang:
    """The command of start number ``start`` (``resume``: continue from the run folder's
    checkpoint with the settings of its ``config.json``), its compute ranks ``slowdown``
    times slower (an emulated device type; None: the cluster emulates none, and the
    job's own ``slow_workers`` stand)."""
    name = job.spec.name
    run_dir = out / "jobs" / name
    module = ("-m", "phalanx.entry.scheduled") if plan.per_rank else ("-m", "phalanx.cli",
                                                                     "train")
    n = workers or job.spec.gpus
    sweep_dead_writers(run_dir)
    if resume and slowdown is not None:
        emulate_type(run_dir, slowdown)
    if resume:
        argv: tuple[str, ...] = (*module, "--resume", str(run_dir), "--no-progress")
    else:
        settings = gang_settings(job.config, n)
        argv = (*module, "--config", str(out / "configs" / f"{name}.json"), "--out",
                str(run_dir), *(("--workers", str(n)) if "workers" in settings else ()),
                "--threads", "1", "--no-progress")
        slow = slow_ranks(RunConfig.from_mapping(settings, source=f"job {name}"),
                          slowdown or 1.0)
        if slow:
            argv += ("--slow-workers", ",".join(f"{r}:{f:g}" for r, f in slow.items()))
    # the ranks import the same phalanx as the scheduler, whatever their folder
    root = str(Path(__file__).resolve().parents[3])
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return Gang(name, start, argv, rank_slots(topology, devices, plan.per_rank),
                plan.per_rank, plan.preemptible, out / "logs" / f"{name}.log",
                out / "ranks" / f"{name}.jsonl", {"PYTHONPATH": path})
