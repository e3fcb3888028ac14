"""Run any multi-process strategy under ``torchrun`` (one or several machines):

    torchrun --nproc-per-node 4 -m phalanx.entry.torchrun \\
        --strategy asp --workers 3 --servers 1 --model lenet5 --out runs/x

Takes the same flags as ``phalanx train``. A strategy whose spec has a ``process_main``
runs here; torchrun's ``--nproc-per-node x --nnodes`` must equal its ``world_size(cfg)``.
Rank 0 writes ``summary.json`` through the same code as ``phalanx train``
(:func:`phalanx.entry.api.finish_run`).

Restarts (``torchrun --max-restarts N``): when a process dies torchrun stops the group and
starts it again (``TORCHELASTIC_RESTART_COUNT`` > 0). Injected faults (``--kill-worker``,
``--kill-server``) belong to the first attempt only; a strategy whose
spec's ``can_restart(cfg)``
(sync, average, the parameter server) continues from its checkpoints in ``--out`` when it
has them. A replacement machine's agent starts at attempt 0: the group runs as the highest
attempt among its ranks. ``--resume DIR`` resumes a failed run by hand.

Several machines: each rank's gloo interface is chosen once here (:mod:`netif`), and a lost
machine ends the others with one line naming it (:mod:`nodes`). See docs/multi-node.md.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from phalanx.config import RunConfig
from phalanx.entry.api import finish_run, make_job
from phalanx.entry.flags import _Parser, add_run_config_flags, config_from_args
from phalanx.entry.resume import resume_config
from phalanx.errors import PhalanxError
from phalanx.metrics import EventLog
from phalanx.parallel.base import read_result
from phalanx.parallel.registry import spec
from phalanx.parallel.spec import StrategySpec
from phalanx.runtime import first_failure, groupstore, memlimit, netif, nodes, preempt
from phalanx.runtime.launch import DEFAULT_TIMEOUT_S


def _restarted(strategy: StrategySpec, cfg: RunConfig, attempt: int) -> RunConfig:
    """The configuration of a group torchrun started again after a process (or a machine)
    was lost."""
    cfg = dataclasses.replace(cfg, kill_worker="", kill_server="")
    if strategy.can_restart is not None and strategy.can_restart(cfg):
        cfg.resume = cfg.out
    return cfg


def _main(rank: int, world: int, cfg: RunConfig, t0: float, attempt: int) -> None:
    if cfg.resume and attempt == 0:  # --resume DIR: DIR's config and checkpoints (checked)
        cfg = resume_config(cfg)
    strategy = spec(cfg.strategy)
    if strategy.process_main is None:
        raise PhalanxError(f"--strategy {cfg.strategy}: "
                           + (strategy.local_only or "runs in one process; use phalanx train"))
    expected = strategy.world_size(cfg)
    if world != expected:
        raise PhalanxError(f"torchrun started {world} processes but --strategy {cfg.strategy} "
                           f"with these flags needs {expected}")
    if attempt > 0:
        cfg = _restarted(strategy, cfg, attempt)
    job = make_job(cfg)
    job.run_dir.mkdir(parents=True, exist_ok=True)
    if rank == 0 and attempt == 0 and not cfg.resume:
        (job.run_dir / "config.json").write_text(json.dumps(cfg.to_json(), indent=2) + "\n")
    if rank == 0 and attempt > 0:
        with EventLog(job.run_dir / "events.jsonl", rank=-1, role="driver") as log:
            log.log("restart", attempt=attempt, resume=bool(cfg.resume))
        sys.stderr.write(f"phalanx: torchrun restart {attempt}: "
                         + ("resuming from the checkpoint in " + cfg.out if cfg.resume
                            else "no checkpoint yet, starting over") + "\n")
    strategy.check_job(job)  # no driver checked it under torchrun
    strategy.process_main(rank, world, job)
    try:
        dist.barrier()  # sync point: every rank's part of the result is on disk
    except RuntimeError as e:
        # a node was lost and the strategy went on without it (a parameter server drops
        # lost workers): this rank's work is done; rank 0 reads the result below
        sys.stderr.write(f"phalanx: rank {rank}: finished; a peer is gone "
                         f"({str(e).splitlines()[0][:120] if str(e) else 'barrier failed'})\n")
        if rank != 0:
            return
    if rank == 0:
        outcome = read_result(job)
        with EventLog(job.run_dir / "events.jsonl", rank=-1, role="driver") as log:
            summary = finish_run(job, outcome, time.perf_counter() - t0, log,
                                 launcher="torchrun")
        print(f"test_accuracy {summary['test_accuracy']:.4f} -> {job.run_dir}")


def _run_attempt(fn, args: tuple, attempt: int, timeout_s: float = DEFAULT_TIMEOUT_S,
                 binding: netif.Binding | None = None) -> None:
    """One rank of attempt ``attempt`` of the group: ``fn(rank, world,
    *args, agreed_attempt)``. The group meets in a fresh store of its own (see
    :mod:`phalanx.runtime.groupstore`: torchrun's agent store keeps a dead attempt's keys).

    ``binding``: the interface gloo binds (see :mod:`phalanx.runtime.netif`). A failure
    while training becomes one line naming the node behind the failed peer's address."""
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if binding is not None:  # gloo reads it when each process group (and subgroup) is made
        os.environ["GLOO_SOCKET_IFNAME"] = binding.iface
    addr = binding.addr if binding is not None and binding.addr else "127.0.0.1"
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "True") == "True":
        agent_store, rank, world = next(dist.rendezvous("env://"))
        agent_store.set_timeout(datetime.timedelta(seconds=timeout_s))
        store = groupstore.open_group_store(agent_store, rank, world, addr, timeout_s)
    else:  # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (what elastic node replacement needs)
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = groupstore.own_store(rank, world, os.environ["MASTER_ADDR"],
                                     int(os.environ["MASTER_PORT"]), addr, timeout_s)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    table = nodes.publish(store, rank, world, int(os.environ.get("GROUP_RANK", "0")), addr)
    attempt = groupstore.agreed_attempt(store, rank, world, attempt)
    try:
        fn(rank, world, *args, attempt)
    except PhalanxError:
        raise
    except Exception as e:  # noqa: BLE001 - a peer's loss surfaces as any backend error
        said = memlimit.explain(e, rank)  # an allocation past --memory-limit: its line
        if said is not e:
            raise said from None
        raise PhalanxError(table.failure_line(rank, e)) from None
    # not on a failure: the process then leaves at once (main: os._exit after its line).
    # Destroying a gloo group waits for its operations in flight (ProcessGroupGloo joins its
    # worker threads): one blocked on a peer that is itself stuck waits out --timeout, and
    # the line naming the lost node came 30 s late, or never (a lost host, once in ~20
    # runs; a rank failing beside an async allreduce: until its peer exited)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the group may already be broken by a lost node
        pass


def build_parser() -> _Parser:
    parser = _Parser(prog="phalanx.entry.torchrun")
    add_run_config_flags(parser)
    parser.add_argument("--iface", default="",
                        help="network interface gloo binds (default: the one that routes to "
                             "torchrun's master address; lo when every rank is on this host)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help="seconds a rank waits for a peer before the run fails "
                             f"(default {DEFAULT_TIMEOUT_S:g})")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # torchrun's environment, read here at the entry point and passed down
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    try:
        if not (args.timeout > 0):
            raise PhalanxError(f"--timeout {args.timeout:g}: must be > 0")
        cfg = config_from_args(args)
        # without torchrun's agent (phalanx schedule), rank 0 serves the group's store at
        # MASTER_ADDR itself: it must be one of this host's addresses
        own = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "True") != "True"
        binding = netif.choose(os.environ.get("MASTER_ADDR", "127.0.0.1"),
                               multi_host=world > local_world, iface=args.iface,
                               env_iface=os.environ.get("GLOO_SOCKET_IFNAME", ""),
                               at_master=own,
                               serves=own and os.environ.get("RANK", "0") == "0")
        _run_attempt(_main, (cfg, time.perf_counter()), attempt, args.timeout, binding)
    except preempt.Preempted as e:  # checkpoint on disk: the scheduler resumes it later
        sys.stderr.write(f"phalanx: {e}\n")
        sys.stderr.flush()
        os._exit(preempt.PREEMPTED_EXIT)
    except PhalanxError as e:
        first_failure.claim(2)
        sys.stderr.write(f"phalanx: error: {e}\n")
        sys.stderr.flush()
        # leave without the interpreter's teardown: a backend thread still blocked on a lost
        # peer would keep the process alive (or abort it) after the error is reported
        os._exit(2)
    # success: results are on disk and the group is destroyed. Leave without the
    # interpreter's teardown (receives posted to a lost peer stay posted; see launch.py)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
