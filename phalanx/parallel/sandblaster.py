"""Sandblaster L-BFGS (Dean et al. 2012, "Large Scale Distributed Deep Networks", 4.2):
DistBelief's batch optimizer on the parameter server.

World layout: rank 0 is the coordinator (runs L-BFGS, holds no parameters), ranks 1..S
are shards (``--servers S``: a slice of the parameters AND of the L-BFGS history each),
ranks S+1..S+N are workers (``--workers N``). Every function evaluation is a batch (the
whole training set; ``--train-limit`` sizes it) cut into ``--portions P`` portions
(default 8 x N) handed to whichever worker is free, with backup tasks near the end;
``--static-portions`` gives each worker one fixed portion instead. Budget: ``--max-steps``
L-BFGS iterations, or else ``--epochs`` passes over the data (each evaluation is one;
left at 1, :data:`DEFAULT_PASSES`); either way L-BFGS stops early once the loss stalls
(``sandblaster_coord.STALL_TOL``), and a run that ends with 0 iterations is an error.

Flags: ``--history m`` (pairs kept), ``--line-search backtracking|none``, ``--lr`` (the
step scale, 1 by default). Faults: workers heartbeat to the coordinator; a worker silent
for ``--ps-timeout`` s (or whose connection broke) is dropped and its portion re-issued;
``--kill-worker W@K`` kills worker W before its K-th portion. See docs/parameter-server.md.
"""

from __future__ import annotations

import math

from phalanx.comm.transport import GlooTransport
from phalanx.config import RunConfig
from phalanx.errors import ConfigError, PhalanxError
from phalanx.metrics import EventLog
from phalanx.parallel.base import Job, Outcome, read_result, stats_dict, with_deaths, write_result
from phalanx.parallel.sandblaster_coord import (
    Coordinator,
    check_progress,
    portions_for,
    worker_totals,
)
from phalanx.parallel.sandblaster_worker import (
    SandblasterLayout,
    SandblasterWorker,
    model_partition,
)
from phalanx.parallel.spec import StrategySpec
from phalanx.parallel.stats import SandblasterStats, Traffic
from phalanx.ps.partition import flat_dense, trainable
from phalanx.ps.sandblaster_shard import SHARD_STATS, SandblasterShard, serve_shard
from phalanx.runtime.exits import merge_losses
from phalanx.runtime.launch import spawn

__all__ = ["SPEC", "check_config", "process_main", "run", "world_size"]


# passes over the data of a default run (--epochs left at 1, no --max-steps): enough for
# logreg on Fashion-MNIST to converge by the stopping rule (docs/parameter-server.md)
DEFAULT_PASSES = 100


def world_size(cfg: RunConfig) -> int:
    return 1 + cfg.servers + cfg.workers


def check_config(cfg: RunConfig) -> None:
    """What Sandblaster cannot honour is an error, not silently ignored."""
    if not cfg.max_steps and math.ceil(cfg.epochs) < 2:
        raise ConfigError(f"--epochs {cfg.epochs:g}: sandblaster's first pass over the data "
                          "only evaluates the starting point, so L-BFGS would take 0 "
                          f"iterations; give at least 2 passes (default {DEFAULT_PASSES})")
    if cfg.static_portions and cfg.portions not in (0, cfg.workers):
        raise ConfigError(f"--portions {cfg.portions}: --static-portions uses one portion "
                          f"per worker ({cfg.workers})")


def check_model(job: Job) -> None:
    model = job.build_model()
    buffers = [name for name, _ in model.named_buffers()]
    if buffers:
        raise ConfigError(f"--model {job.config.model}: has buffers ({buffers[0]}, ...: e.g. "
                          "BatchNorm statistics) that sandblaster L-BFGS cannot handle; use "
                          "a model without them (logreg, mlp, lenet5)")
    if portions_for(job.config) > len(job.train):
        raise ConfigError(f"--portions {portions_for(job.config)}: more portions than "
                          f"training samples ({len(job.train)})")


def run(job: Job, log: EventLog) -> Outcome:
    first_worker = 1 + job.config.servers  # rank 0 coordinates, ranks 1..S are shards

    def name(rank: int) -> str:
        if rank == 0:
            return "coordinator"
        return f"shard {rank - 1}" if rank < first_worker else f"worker {rank - first_worker}"

    # a worker that dies (crash, kill -9, OOM) is the coordinator's to detect: its portions
    # are re-issued
    deaths = spawn(process_main, world_size(job.config), (job,),
                   timeout_s=max(120.0, 2 * job.config.ps_timeout),
                   survivable=lambda rank: rank >= first_worker, name=name,
                   on_death=lambda death: log.log("died", **death.event()))
    # the coordinator's view of the lost workers and the driver's, merged
    return with_deaths(read_result(job), deaths, first_worker=first_worker,
                       seer="coordinator")


def process_main(rank: int, world: int, job: Job) -> None:
    cfg = job.config
    layout = SandblasterLayout(cfg.servers, cfg.workers)
    if world != layout.world:
        raise PhalanxError(f"{world} processes, but sandblaster with --servers {cfg.servers} "
                           f"and --workers {cfg.workers} needs {layout.world}")
    transport = GlooTransport(rank, world)
    shard, worker = layout.shard_of(rank), layout.worker_of(rank)
    role = "coordinator" if rank == 0 else "server" if shard is not None else "worker"
    tb = job.run_dir / "tensorboard" if cfg.tensorboard and rank == 0 else None
    with EventLog(job.run_dir / "events.jsonl", rank=rank, role=role, tensorboard_dir=tb) as log:
        if rank == layout.coordinator:
            coordinator_main(job, transport, layout, log)
        elif shard is not None:
            model = job.build_model()
            part = model_partition(model, cfg.servers)
            a, b = part.dense_range(shard)
            state = SandblasterShard(shard, flat_dense(part, trainable(model))[a:b],
                                     cfg.history)
            serve_shard(state, transport, layout.coordinator,
                        lambda r: layout.worker_of(r) is not None)
        else:
            SandblasterWorker(job, transport, layout, worker, log).run()


def coordinator_main(job: Job, transport: GlooTransport, layout: SandblasterLayout,
                     log: EventLog) -> None:
    coord = Coordinator(job, transport, layout, log)
    iterations, loss = coord.optimise()
    model = coord.fetch_model()
    workers, shard_stats = coord.finish()
    per_worker = worker_totals(workers)
    c = coord.totals
    bytes_sent = int(transport.counter.sent + sum(s["bytes_sent"] for s in per_worker.values())
                     + sum(coord.link.shard_sent))
    stats = SandblasterStats(
        bytes_sent=bytes_sent, bytes_per_sample=Traffic.per_sample(bytes_sent, coord.samples),
        iterations=iterations, function_evals=coord.evals, final_loss=loss,
        stop_reason=coord.stop_reason,
        line_search=job.config.line_search, history=job.config.history,
        portions=coord.portions, servers=job.config.servers,
        portions_per_worker=c.portions_done, backups_issued=c.backups_issued,
        backups_wasted=c.backups_wasted, portions_reissued=c.reissued,
        workers_lost=sorted(set(coord.lost)), coordinator_bytes=coord.link.bytes,
        worker_losses=merge_losses(dict.fromkeys(coord.lost), {}, seer="coordinator"),
        coordinator_fetch_bytes=coord.fetch_bytes,
        **{f"shard_{k}": int(v) for k, v in zip(SHARD_STATS, shard_stats)})
    log.log("sandblaster_stats", **stats_dict(stats))
    # every process has stopped (finish): a run that trained nothing fails here, in one
    # line, instead of writing a result
    check_progress(iterations, coord.stop_reason)
    write_result(job, model.state_dict(), train_samples=coord.samples, steps=iterations,
                 stats=stats)


SPEC = StrategySpec(
    name="sandblaster", summary="Sandblaster L-BFGS: a coordinator hands batch portions to "
    "workers; shards hold parameters and history", run=run, process_main=process_main,
    world_size=world_size, check=check_config, check_job=check_model,
    supports=frozenset({"kill_worker"}),
    options=("portions", "history", "line_search", "static_portions", "servers", "ps_timeout",
             "heartbeat_s"),
    # L-BFGS on one deterministic full-batch objective: no update rule, schedule, batches,
    # augmentation or shards; no checkpoints
    unused={**{name: "L-BFGS takes its own steps on the full-batch objective (--lr scales "
                     "them)" for name in ("rule", "schedule", "weight_decay", "warmup_steps",
                                          "clip_grad_norm")},
            **{name: "its objective is the whole, unaugmented training set"
               for name in ("batch_size", "grad_accum", "augment")},
            **{name: "it writes no checkpoints" for name in ("checkpoint_every", "resume")},
            "memory_limit": "its coordinator, shards and workers are not placed per rank "
                            "(setup_rank), where the limit is set"},
    default_lr=1.0,  # L-BFGS's natural step is 1 (--lr scales it)
    default_epochs=DEFAULT_PASSES,
    full_batch=True)
