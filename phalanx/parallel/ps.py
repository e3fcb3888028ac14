"""The parameter-server family: bsp, asp, ssp, softsync, downpour, dc-asgd.

World layout: ranks ``0..S-1`` are server shards (``--servers S``), ranks ``S..S+N-1``
are workers ``0..N-1`` (``--workers N``). Every strategy is the same server and worker
code with a different consistency model and server rule:

* bsp: a barrier each step; ``--rule`` on the average of the N gradients;
* asp: no waiting; every push applied at once;
* ssp: a worker may be at most ``--staleness`` clocks ahead of the slowest;
* softsync: the average of every ``--softsync`` n pushes is applied;
* downpour: ASP, pull every ``--nfetch`` steps, push summed gradients every ``--npush``
  steps (the server's ``--rule``, e.g. adagrad, keeps the optimizer state);
* dc-asgd: ASP with delay compensation (``--dc-lambda``, ``--dc-adaptive``) before ``--rule``.

``--staleness-lr`` divides every applied step by its staleness, for any of them.
Worker 0 evaluates the current server weights once per epoch (or every ``--eval-every``
steps); server 0 assembles the final model and writes the result.

Faults (``docs/faults.md``): workers heartbeat; a dead worker is dropped
(``--on-worker-loss continue``) or ends the run (``stop``: at once when the driver sees
the process die, else when its heartbeats stop). Shards checkpoint every
``--checkpoint-every`` updates, and, with checkpoints on, when they are stopped (SIGTERM:
a scheduler's preemption, the driver ending the run, a Ctrl-C) or the run fails on a lost
worker: the state they hold then, buffered pushes and lost workers included, and exit with
``PREEMPTED_EXIT``. ``--resume DIR`` restarts every process, the shards from their
checkpoints and the workers from the clock the shards restored: no update is lost or
applied twice. Fault injection: ``--kill-worker``, ``--kill-server``, ``--drop-messages``.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from dataclasses import dataclass

import torch
from torch import nn

from phalanx.comm.exchange import pull_deltas_for
from phalanx.comm.shm import SHM_PREFIX, SHM_ROOT, ShmTransport
from phalanx.comm.transport import GlooTransport, Transport
from phalanx.config import RunConfig
from phalanx.errors import ConfigError, PhalanxError
from phalanx.metrics import EventLog
from phalanx.parallel import ps_resize
from phalanx.parallel.base import Job, Outcome, read_result, stats_dict, with_deaths, write_result
from phalanx.parallel.device_data import train_bytes
from phalanx.parallel.ps_worker import WorkerStats, steps_per_worker, worker_main
from phalanx.parallel.spec import Resize, StrategySpec, nothing, workers_momentum
from phalanx.parallel.stats import ParameterServerStats, Traffic
from phalanx.ps.checkpoint import read_shard, restore_shard, save_shard, shard_path
from phalanx.ps.consistency import Consistency, make_consistency
from phalanx.ps.partition import flat_dense, partition, trainable, unflatten_into
from phalanx.ps.server import Layout, ShardResult, gather_final, send_final, serve
from phalanx.ps.shard import ShardState
from phalanx.rules import UpdateRule, dc_asgd, make_rule, staleness_scaled
from phalanx.runtime import preempt, stop_flag
from phalanx.runtime.exits import Death, merge_losses
from phalanx.runtime.faults import KILLED_SERVER_EXIT, die, kill_point, parse_kills
from phalanx.runtime.launch import spawn
from phalanx.runtime.placement import DeviceSupport, setup_rank, spawn_backend
from phalanx.runtime.signals import make_run_tempdir

__all__ = ["SPECS", "assemble", "check_config", "check_resume", "make_shard", "process_main",
           "run", "server_main", "steps_per_worker", "world_size", "worker_main"]

# shards stay on the CPU; a worker's receive is from its shards only, but a shard receives
# from any worker (NCCL has no receive-from-any)
DEVICE = DeviceSupport(nccl=False, host_servers=True)
# how long a stopped run's driver waits for its shards to write their state (they exit as
# soon as it is on disk; a scheduler's own grace, --grace, kills the group after its own)
STOP_GRACE_S = 60.0


@dataclass(frozen=True)
class Preset:
    """A parameter-server strategy is the same server and worker code with these set."""

    consistency: str  # the model when --consistency is not given (ps.consistency.MODELS)
    delay_compensation: bool = False  # DC-ASGD's server rule prefix; shards keep backups
    fetch_push: bool = False  # --nfetch / --npush (Downpour)


PRESETS: dict[str, Preset] = {
    "bsp": Preset("bsp"),
    "asp": Preset("asp"),
    "ssp": Preset("ssp"),
    "softsync": Preset("softsync"),
    "downpour": Preset("asp", fetch_push=True),
    "dc-asgd": Preset("asp", delay_compensation=True),
}


def preset(cfg: RunConfig) -> Preset:
    return PRESETS[cfg.strategy]


def consistency(cfg: RunConfig) -> Consistency:
    """The run's consistency model: ``--consistency``, else the strategy's preset."""
    return make_consistency(cfg.consistency or preset(cfg).consistency, cfg)


def world_size(cfg: RunConfig) -> int:
    return cfg.servers + cfg.workers


def check_config(cfg: RunConfig) -> None:
    model = consistency(cfg)  # --consistency names a model (one line otherwise)
    if not preset(cfg).fetch_push and (cfg.nfetch != 1 or cfg.npush != 1):
        raise ConfigError(f"--nfetch/--npush: only --strategy downpour uses them "
                          f"(got --strategy {cfg.strategy})")
    if cfg.pull_ahead and not (model.pulls_ahead and not preset(cfg).delay_compensation):
        raise ConfigError(f"--pull-ahead: --strategy {cfg.strategy} waits for fresh weights"
                          + (f" (consistency {model.name})" if cfg.consistency else "")
                          + " (only asp and downpour can pull ahead)")


def check_resume(cfg: RunConfig) -> None:
    """Before any process starts: every shard's checkpoint exists, passes its checksum and
    belongs to this run (one-line CheckpointError otherwise; nothing is written)."""
    for k in range(cfg.servers):
        read_shard(shard_path(cfg.resume, k), shard=k, servers=cfg.servers,
                   workers=cfg.workers, strategy=cfg.strategy)


def can_restart(cfg: RunConfig) -> bool:
    """For ``phalanx.entry.torchrun`` on a restarted attempt (a process or a node was lost): does
    every shard have a checkpoint in ``--out`` to restore from? (Several machines: ``--out``
    must be a shared file system, so a lost host's shard restores anywhere.)"""
    return cfg.checkpoint_every > 0 and all(shard_path(cfg.out, k).is_file()
                                            for k in range(cfg.servers))


def run(job: Job, log: EventLog) -> Outcome:
    check_config(job.config)
    if job.config.resume:
        check_resume(job.config)
    servers = job.config.servers
    # every rank is on this host: messages go through shared memory unless told otherwise.
    # The rings' folder is ours: removed on every exit (a kill -9: by the next run's sweep)
    shm = (make_run_tempdir(SHM_PREFIX, SHM_ROOT) if job.config.transport != "gloo"
           else None)
    try:
        deaths = _spawn(job, servers, shm, log)
    finally:
        if shm is not None:
            shutil.rmtree(shm, ignore_errors=True)
    # the servers' view of the lost workers (in the result) and the driver's, merged
    return with_deaths(read_result(job), deaths, first_worker=servers)


def _spawn(job: Job, servers: int, shm: str | None, log: EventLog) -> list[Death]:
    cfg = job.config
    goes_on = cfg.on_worker_loss == "continue"
    # a worker that dies (crash, kill -9, OOM) is the servers' to drop by its heartbeats
    # under --on-worker-loss continue; under stop its death ends the run at once
    return spawn(
        process_main, world_size(cfg), (job, shm), timeout_s=max(120.0, 2 * cfg.ps_timeout),
        survivable=lambda rank: goes_on and rank >= servers,
        name=lambda rank: f"server {rank}" if rank < servers else f"worker {rank - servers}",
        stand_ins=goes_on,  # else a loss ends it at once
        note=lambda rank: "" if rank < servers else (
            # continue: its death ended the run only because no stand-in could take its
            # place (launch._published): a peer may have read its address already
            "; it had told its peers where to connect, so no stand-in could take its "
            "place in the rendezvous and the run cannot go on without it" if goes_on
            else "; --on-worker-loss stop ends the run"),
        # stopped, the shards write their state first (a checkpoint of the whole slice)
        saves_on_stop=(lambda rank: rank < servers) if cfg.checkpoint_every else None,
        grace_s=STOP_GRACE_S if cfg.checkpoint_every else 3.0,
        backend=spawn_backend(cfg, world_size(cfg), DEVICE),
        on_death=lambda death: log.log("died", **death.event()))


def make_transport(cfg: RunConfig, rank: int, world: int, shm: str | None) -> Transport:
    """``--transport``: shared memory in ``shm`` (the launcher's folder: every rank on one
    host), else gloo (``auto`` under torchrun, which may span hosts)."""
    if shm is not None and cfg.transport != "gloo":
        return ShmTransport(rank, world, shm)
    if cfg.transport == "shm":
        raise PhalanxError("--transport shm: needs the ranks started by phalanx train on one "
                           "host; use --transport gloo (or auto) under torchrun")
    # a shard (ranks 0..servers-1) takes every worker's message at once
    return GlooTransport(rank, world, concurrent=range(cfg.servers, world)
                         if rank < cfg.servers else ())


def process_main(rank: int, world: int, job: Job, shm: str | None = None) -> None:
    cfg = job.config
    check_config(cfg)
    layout = Layout(cfg.servers, cfg.workers)
    if world != layout.world:
        raise PhalanxError(f"{world} processes, but --servers {cfg.servers} + --workers "
                           f"{cfg.workers} need {layout.world}")
    server = rank < layout.servers
    # shards stay on the CPU; worker w computes on the GPU its index picks
    place = setup_rank(cfg, rank, world, DEVICE, on_cpu=server,
                       compute_rank=None if server else rank - layout.servers,
                       compute_ranks=layout.workers, data_bytes=train_bytes(job))
    transport = make_transport(cfg, rank, world, shm)
    role = "server" if server else "worker"
    tb = job.run_dir / "tensorboard" if cfg.tensorboard else None
    with EventLog(job.run_dir / "events.jsonl", rank=rank, role=role, tensorboard_dir=tb) as log:
        if rank < layout.servers:
            server_main(job, transport, layout, rank, log)
        else:
            worker_main(job, transport, layout, rank - layout.servers, log, place)


# ---- configuration helpers (shared by processes and the in-process tests) ---------------


def server_updates(cfg: RunConfig, steps: int) -> int:
    """How many updates a shard applies (the horizon of an lr schedule)."""
    return consistency(cfg).updates(cfg.workers, math.ceil(steps / cfg.npush))


def server_rule(cfg: RunConfig, total_updates: int) -> UpdateRule:
    prefix: list[UpdateRule] = []
    if preset(cfg).delay_compensation:
        prefix.append(dc_asgd(cfg.dc_lambda, cfg.dc_adaptive, cfg.dc_momentum))
    if cfg.staleness_lr:
        prefix.append(staleness_scaled())
    return make_rule(cfg, total_updates, prefix=tuple(prefix))


def make_shard(job: Job, shard: int, log=None) -> ShardState:
    cfg = job.config
    model = job.build_model()
    part = partition(model, cfg.servers)
    params = trainable(model)
    a, b = part.dense_range(shard)
    rows = params[part.table.param].detach()[shard :: cfg.servers] if part.table else None
    state = ShardState(shard, part, flat_dense(part, params)[a:b], rows,
                       server_rule(cfg, server_updates(cfg, steps_per_worker(job))),
                       consistency(cfg), cfg.workers,
                       keep_backups=preset(cfg).delay_compensation, log=log,
                       pulls=pull_deltas_for(cfg))
    # the scheduler's noise estimate (ps/noise_part): BSP, and exact pushes only (a
    # compressed push's error would count as gradient noise)
    if state.consistency.name == "bsp" and cfg.compress == "none":
        state.noise_batch = cfg.batch_size * cfg.grad_accum
    if cfg.resume:
        path = shard_path(cfg.resume, shard)
        restore_shard(state, read_shard(path, shard=shard, servers=cfg.servers,
                                        workers=cfg.workers, strategy=cfg.strategy), path)
        if log is not None:
            log("resume", shard=shard, version=state.version, clocks=list(state.clocks))
    return state


class ShardKeeper:
    """What a shard does after an update: a checkpoint every ``--checkpoint-every``
    updates (only with an empty buffer, i.e. right after an update), and the injected
    ``--kill-server`` crash. The crash comes after the checkpoint of the same update, so
    a killed shard loses the updates since its last checkpoint: fewer than K."""

    def __init__(self, job: Job, shard: int, log) -> None:
        cfg = job.config
        self.cfg, self.shard, self.log = cfg, shard, log
        self.path = shard_path(job.run_dir, shard)
        self.kill_at = kill_point(parse_kills(cfg.kill_server, "--kill-server", "UPDATE"), shard)
        self.saved = None  # version of the last checkpoint

    def __call__(self, state: ShardState) -> None:
        k = self.cfg.checkpoint_every
        if self.saved is None:
            self.saved = state.version - state.version % k if k else 0
        if k and not state.buffer and state.version - self.saved >= k:
            self.save(state)
        if self.kill_at is not None and state.version >= self.kill_at:
            die(self.log, "server", self.shard, f"update {state.version}", KILLED_SERVER_EXIT)

    def save(self, state: ShardState, why: str = "") -> None:
        """The shard's whole state to its checkpoint now (``why``: not a periodic one; its
        buffered pushes and lost workers are in it too)."""
        save_shard(state, self.path, servers=self.cfg.servers, strategy=self.cfg.strategy)
        self.saved = state.version
        extra = {"reason": why, "buffered": len(state.buffer),
                 "clocks": list(state.clocks), "lost": sorted(state.lost_workers)} if why else {}
        self.log("checkpoint", shard=self.shard, version=state.version, **extra)


# ---- server processes ----------------------------------------------------------------


def server_main(job: Job, transport: Transport, layout: Layout, shard: int,
                log: EventLog) -> None:
    cfg = job.config
    state = make_shard(job, shard, log.log)
    keeper = ShardKeeper(job, shard, log.log)
    if cfg.checkpoint_every:
        stop_flag.arm()  # SIGTERM: write the state, then exit with PREEMPTED_EXIT
    try:
        serve(state, transport, layout, cfg.ps_timeout, heartbeats=True,
              on_worker_loss=cfg.on_worker_loss, after_update=keeper)
    except stop_flag.Stop:
        keeper.save(state, "stop")
        raise preempt.Preempted(state.version, unit="update") from None
    except PhalanxError:
        if cfg.checkpoint_every:
            keeper.save(state, "failure")  # a lost worker under stop: keep what we have
        raise
    if shard != 0:
        send_final(state, transport, layout)
        return
    results = gather_final(state, transport, layout, cfg.ps_timeout)
    model, samples, steps, stats = assemble(job, state.part, results, state.lost_workers)
    log.log("ps_stats", **stats_dict(stats))
    write_result(job, model.state_dict(), train_samples=samples, steps=steps, stats=stats)
    transport.flush(lost={layout.worker_rank(w) for w in state.lost_workers})


def assemble(job: Job, part, results: list[ShardResult],
             lost_workers: dict[int, int] | None = None,
             ) -> tuple[nn.Module, int, int, ParameterServerStats]:
    """The final model from the shards' parameters (+ the first finished worker's buffers),
    and the stats. ``lost_workers`` (dead worker -> its clock) counts their samples."""
    lost_workers = lost_workers or {}
    cfg = job.config
    model = job.build_model()
    params = trainable(model)
    unflatten_into(part, torch.cat([r.dense for r in results]), params)
    with torch.no_grad():
        if part.table is not None:
            for r in results:
                params[part.table.param][r.shard :: part.shards] = r.rows
        _restore_buffers(model, results[0].worker_stats)
    per_worker = [WorkerStats.from_tensor(t[0]) for t in results[0].worker_stats.values()]
    # a dead worker sent no counters: its applied pushes are its clock x npush steps
    lost_samples = sum(c * cfg.npush * cfg.batch_size * cfg.grad_accum
                       for c in lost_workers.values())
    samples = int(sum(w.samples for w in per_worker) + lost_samples)
    steps = int(max((w.steps for w in per_worker), default=0))
    hist = [0] * max(len(r.histogram) for r in results)
    for r in results:
        for s, c in enumerate(r.histogram):
            hist[s] += c
    applied = sum(hist)

    def shards(name: str) -> int:
        return int(sum(r.stat(name) for r in results))

    def workers(name: str) -> int:
        return int(sum(getattr(w, name) for w in per_worker))

    bytes_sent = shards("bytes_sent") + workers("bytes_sent")
    stats = ParameterServerStats(
        bytes_sent=bytes_sent, bytes_per_sample=Traffic.per_sample(bytes_sent, samples),
        consistency=consistency(cfg).name, servers=cfg.servers,
        staleness_mean=sum(s * c for s, c in enumerate(hist)) / applied if applied else 0.0,
        staleness_max=len(hist) - 1 if hist else 0, staleness_histogram=hist,
        pushes_applied=shards("pushes_applied"), pushes_rejected=shards("pushes_rejected"),
        messages_rejected=shards("messages_rejected"),
        server_updates=int(results[0].stat("updates")), pushes_lost=shards("pushes_lost"),
        pushes_dropped=workers("pushes_dropped"), duplicates=shards("duplicates"),
        pushes_skipped=workers("pushes_skipped"), values_clipped=workers("values_clipped"),
        pull_resyncs=shards("pull_resyncs"), workers_lost=sorted(lost_workers),
        worker_losses=merge_losses(lost_workers, {}))
    return model, samples, steps, stats


def _restore_buffers(model: nn.Module, worker_stats: dict) -> None:
    """Buffers (BatchNorm statistics) are not served by the PS: take those of the first
    worker that finished (worker 0 unless it died)."""
    with_buffers = sorted(w for w, t in worker_stats.items() if len(t) > 1)
    if with_buffers:
        flat, offset = worker_stats[with_buffers[0]][1], 0
        for buf in model.buffers():
            buf.copy_(flat[offset : offset + buf.numel()].view_as(buf).to(buf.dtype))
            offset += buf.numel()


# ---- the strategies: one spec per preset -------------------------------------------------

_SUMMARY = {
    "bsp": "parameter server, bulk synchronous: a barrier and one averaged update per step",
    "asp": "parameter server, asynchronous: every push applied at once",
    "ssp": "parameter server, stale synchronous: at most --staleness clocks ahead",
    "softsync": "parameter server: the average of every --softsync pushes applied",
    "downpour": "parameter server, Downpour SGD: fetch every --nfetch, push every --npush",
    "dc-asgd": "parameter server, asynchronous with delay compensation (--dc-lambda)",
}
_OPTIONS = {"downpour": ("nfetch", "npush", "downpour_local_steps"),
            "dc-asgd": ("dc_lambda", "dc_adaptive", "dc_momentum")}
# read by every parameter-server strategy (--pull-ahead: the spec's check says which)
_SHARED_OPTIONS = ("servers", "ps_timeout", "heartbeat_s", "on_worker_loss", "pull_ahead",
                   "transport")

def _resized(old: RunConfig, new: RunConfig) -> RunConfig:
    return ps_resize.settings(old, new, consistency(old))


# workers and their batch change, the shards stay (ps_resize.py)
RESIZE = Resize(refusal=ps_resize.refusal, settings=_resized, rewrite=ps_resize.rewrite)

SPECS = tuple(
    StrategySpec(name=name, summary=_SUMMARY[name], run=run, process_main=process_main,
                 world_size=world_size, check=check_config,
                 check_resume=check_resume, can_restart=can_restart,
                 supports=frozenset({"kill_worker", "kill_server", "drop_messages",
                                     "compress", "sparse_grads"}),
                 options=(*_SHARED_OPTIONS, *_OPTIONS.get(name, ())), shards_by="workers",
                 device=DEVICE, preset=dataclasses.asdict(p), resize=RESIZE,
                 # BSP averages N gradients per update, like sync; the asynchronous presets
                 # keep plain SGD: asynchrony already acts as momentum (Mitliagkas et al.
                 # 2016; measured: ASP with momentum 0.9 sat at ln 10, docs/data-parallel.md)
                 default_rule=workers_momentum if p.consistency == "bsp" else nothing)
    for name, p in PRESETS.items())
