"""Checkpoints, resume and injected worker kills for the replicated strategies (``sync``,
``average``).

Every ``--checkpoint-every K`` steps rank 0 writes ``RUN_DIR/checkpoint.pt`` (atomic,
checksummed: :func:`phalanx.runtime.checkpoint.save_checkpoint`) with everything needed to
continue the SAME trajectory: the model, the update-rule state, the step, the data
position (epoch, samples), and per rank its augmentation and torch RNG states and byte
counter (and, for ``average``, its own rule state: local optimizers differ between
averaging rounds). The data order is a pure function of (seed, epoch, rank), so a resumed
worker skips the micro-batches it already consumed and continues where the checkpoint
left off: a resumed run ends with the parameters of an uninterrupted run, and the steps
between the checkpoint and the crash (at most K-1) are computed twice.

When a run resumes (decided by the launcher, never by this module reading the
environment): ``phalanx train --resume DIR`` (``cfg.resume`` = DIR), or a group restarted by
``torchrun --max-restarts`` (``phalanx.entry.torchrun`` sets ``cfg.resume`` on attempts after the
first when a checkpoint exists). A fresh run deletes a stale checkpoint of an earlier run
in the same directory before its first collective, so a restart never resumes someone
else's run; the checkpoint also carries a fingerprint of every setting that shapes the
trajectory and is refused (one line) when it does not match.

``--kill-worker RANK@STEP``: worker RANK exits with :data:`KILLED_EXIT` (non-zero, so the
launcher stops the group and torchrun restarts it) when it is about to start a step after
STEP steps; kills are injected in the first attempt only (the restart clears them).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from phalanx.comm.counters import ByteCounter
from phalanx.comm.exchange import Compression
from phalanx.config import RunConfig
from phalanx.errors import ConfigError
from phalanx.metrics import EventLog
from phalanx.parallel.loop import Position
from phalanx.rules import state_tensors
from phalanx.runtime.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from phalanx.runtime.faults import die, kill_point, parse_kills
from phalanx.runtime.launch import WorkerFailed, spawn

FORMAT = "phalanx-dp/1"
CHECKPOINT = "checkpoint.pt"
# non-zero on purpose (unlike the parameter server's killed worker, which its peers
# survive): a sync group cannot go on without a replica, so the launcher must stop it and
# torchrun --max-restarts restart it from the last checkpoint
KILLED_EXIT = 4
# settings that do not change the trajectory: a resumed run may differ in these
NOT_TRAJECTORY = ("out", "resume", "kill_worker", "kill_server", "drop_messages", "progress",
                  "tensorboard", "eval_every", "checkpoint_every", "threads", "ps_timeout",
                  "heartbeat_s", "on_worker_loss", "slow_workers", "overwrite")


def checkpoint_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT


def fingerprint(cfg: RunConfig) -> str:
    values = {k: v for k, v in cfg.to_json().items() if k not in NOT_TRAJECTORY}
    return json.dumps(values, sort_keys=True)


def snapshot(cfg: RunConfig, model_state: dict[str, torch.Tensor], pos: Position,
             rule_state: list[torch.Tensor] | tuple = (), ranks: list | tuple = (),
             workers: int = 1, comm: list | tuple = ()) -> dict[str, Any]:
    """The one checkpoint format every strategy writes to ``checkpoint.pt``. A strategy
    that resumes (sync, average) fills ``ranks`` (each rank's own state) and its rule
    state; one that keeps snapshots only (single, Hogwild!, the stages) leaves ``ranks``
    empty, which ``--resume`` refuses. ``comm``: per rank, its compression state
    (``--compress``: error-feedback residuals, PowerSGD's generator and warm Q;
    :meth:`~phalanx.comm.exchange.Compression.state_tensors`), empty without."""
    return {"format": FORMAT, "strategy": cfg.strategy, "workers": workers,
            "fingerprint": fingerprint(cfg), "step": pos.step, "epoch": pos.epoch,
            "samples": pos.samples, "rounds": pos.rounds, "wall_s": float(pos.wall_s),
            "model": {k: v.detach().to("cpu", copy=True) for k, v in model_state.items()},
            "rule_state": [t.detach().to("cpu", copy=True) for t in rule_state],
            "ranks": list(ranks), "comm": [list(c) for c in comm]}


def save_snapshot(job, model_state: dict[str, torch.Tensor], pos: Position,
                  rule_state: list[torch.Tensor] | tuple = ()) -> None:
    """A snapshot checkpoint (no per-rank state) in the one format."""
    save_checkpoint(checkpoint_path(job.run_dir), snapshot(job.config, model_state, pos,
                                                            rule_state))


def check_checkpointing(cfg: RunConfig, period: int) -> None:
    """Replicas that are equal only every ``period`` steps (right after an averaging
    round) are checkpointed there."""
    if cfg.checkpoint_every % period:
        raise ConfigError(f"--checkpoint-every: {cfg.checkpoint_every} must be a multiple of "
                          f"--period {period} (replicas are equal only after averaging)")


@dataclass
class RankState:
    """What differs between ranks and must come back for the same trajectory."""

    aug_rng: torch.Tensor
    torch_rng: torch.Tensor
    sent: torch.Tensor  # int64 scalar: bytes this rank sent
    rule_state: list[torch.Tensor] = field(default_factory=list)  # only when not shared

    @classmethod
    def capture(cls, aug_gen: torch.Generator, counter: ByteCounter, state: Any,
                shared: bool) -> RankState:
        # host copies: gathered over gloo (no CUDA point-to-point) and saved device-free
        return cls(aug_gen.get_state(), torch.get_rng_state(),
                   torch.tensor(counter.sent, dtype=torch.int64),
                   [] if shared else [t.detach().to("cpu", copy=True)
                                      for t in state_tensors(state)])

    def tensors(self) -> list[torch.Tensor]:
        """The checkpoint's (and the gather's) form: fixed-shape tensors in this order."""
        return [self.aug_rng, self.torch_rng, self.sent, *self.rule_state]

    @classmethod
    def from_tensors(cls, tensors: list[torch.Tensor]) -> RankState:
        return cls(tensors[0], tensors[1], tensors[2], list(tensors[3:]))

    def apply(self, aug_gen: torch.Generator, counter: ByteCounter, path: Path,
              rank: int) -> None:
        """Back into this process: the RNG streams and the byte count."""
        try:
            aug_gen.set_state(self.aug_rng)
            torch.set_rng_state(self.torch_rng)
        except (RuntimeError, TypeError, ValueError):
            raise CheckpointError(f"{path}: bad RNG state of rank {rank}") from None
        counter.sent = int(self.sent)


def read_checkpoint(cfg: RunConfig, path: Path | None = None) -> dict[str, Any]:
    """Load ``RUN_DIR/checkpoint.pt`` and check it belongs to a run with these settings."""
    path = path or checkpoint_path(cfg.resume or cfg.out)
    payload = load_checkpoint(path)

    def need(cond: bool, what: str) -> None:
        if not cond:
            raise CheckpointError(f"{path}: {what}")

    need(payload.get("format") == FORMAT, "not a sync / average checkpoint")
    need(payload.get("strategy") == cfg.strategy and payload.get("workers") == cfg.workers,
         f"written by --strategy {payload.get('strategy')} --workers {payload.get('workers')}, "
         f"not --strategy {cfg.strategy} --workers {cfg.workers}")
    saved = payload.get("fingerprint")
    need(isinstance(saved, str), "field 'fingerprint' missing")
    if saved != fingerprint(cfg):
        try:
            old, new = json.loads(saved), json.loads(fingerprint(cfg))
            diff = next((k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)),
                        "?")
        except (ValueError, AttributeError):
            diff = "?"
        need(False, f"written with other settings (--{diff.replace('_', '-')} differs)")
    for key in ("step", "epoch", "samples", "rounds"):
        need(isinstance(payload.get(key), int) and payload[key] >= 0, f"bad {key!r}")
    need(isinstance(payload.get("wall_s"), float), "bad 'wall_s'")
    need(isinstance(payload.get("model"), dict), "field 'model' missing")
    ranks = payload.get("ranks")
    need(isinstance(ranks, list) and len(ranks) == cfg.workers
         and all(isinstance(r, list) and len(r) >= 3
                 and all(isinstance(t, torch.Tensor) for t in r) for r in ranks),
         "bad per-rank state")
    comm = payload.setdefault("comm", [])  # (absent: written before compression had state)
    need(isinstance(comm, list) and len(comm) in (0, cfg.workers)
         and all(isinstance(c, list) and all(isinstance(t, torch.Tensor) for t in c)
                 for c in comm), "bad compression state")
    need(isinstance(payload.get("rule_state"), list)
         and all(isinstance(t, torch.Tensor) for t in payload["rule_state"]),
         "field 'rule_state' missing")
    return payload


def _fill(targets: list[torch.Tensor], saved: list[torch.Tensor], path: Path) -> None:
    if len(saved) != len(targets) or any(a.shape != b.shape or a.dtype != b.dtype
                                         for a, b in zip(saved, targets)):
        raise CheckpointError(f"{path}: optimizer state does not match --rule")
    with torch.no_grad():
        for t, v in zip(targets, saved):
            t.copy_(v)  # rule states are tuples of tensors: fill them in place


class Checkpointer:
    """Takes and restores the checkpoints of one worker (rank 0 writes; every rank adds its
    own RNG state, so saving is a collective every rank calls at the same steps)."""

    def __init__(self, cfg: RunConfig, run_dir: Path, rank: int, world: int, log: EventLog,
                 shared_rule_state: bool) -> None:
        self.cfg, self.rank, self.world, self.log = cfg, rank, world, log
        self.path = checkpoint_path(run_dir)
        self.shared = shared_rule_state
        self.kill_at = kill_point(parse_kills(cfg.kill_worker, "--kill-worker"), rank)
        if not cfg.resume and rank == 0:
            # a fresh run: a checkpoint left by an earlier run in this directory must never
            # be resumed by a restart of this one. Done before the first collective, so no
            # rank can crash (and be restarted) before it is gone.
            self.path.unlink(missing_ok=True)

    def due(self, step: int, final: bool = False) -> bool:
        k = self.cfg.checkpoint_every
        return final or bool(k and step % k == 0)

    def maybe_kill(self, step: int) -> None:
        """``--kill-worker``: die as a crash would, about to start a step after ``step``."""
        if self.kill_at is not None and step == self.kill_at:
            die(self.log.log, "worker", self.rank, f"step {step}", KILLED_EXIT)

    def save(self, model: nn.Module, state: Any, pos: Position, aug_gen: torch.Generator,
             counter: ByteCounter, compression: Compression | None = None) -> None:
        """Collective: every rank must call it at the same step."""
        ranks = self._gather(RankState.capture(aug_gen, counter, state, self.shared).tensors())
        comm = (self._gather(compression.state_tensors())
                if compression is not None and compression.active else [])
        if self.rank == 0:
            save_checkpoint(self.path, snapshot(self.cfg, model.state_dict(), pos,
                                                state_tensors(state), ranks, self.world, comm))
            self.log.log("checkpoint", step=pos.step, epoch=pos.epoch)
        if self.world > 1:
            # sync point: after it every rank knows checkpoint ``step`` is on disk, so a
            # crash from here on resumes from it (a kill right after a checkpoint redoes
            # nothing, whichever rank dies)
            dist.barrier()

    def _gather(self, mine: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        """Every rank's tensors at rank 0 (fixed shapes, the same on every rank, as
        everything on the wire); bookkeeping, not counted as training traffic."""
        if self.world == 1:
            return [mine]
        gathered = [[torch.empty_like(t) for _ in range(self.world)] for t in mine]
        for t, out in zip(mine, gathered):
            dist.gather(t, out if self.rank == 0 else None, dst=0)
        return [[out[r] for out in gathered] for r in range(self.world)]

    def restore(self, model: nn.Module, state: Any, aug_gen: torch.Generator,
                counter: ByteCounter, compression: Compression | None = None,
                device: torch.device | str = "cpu") -> Position:
        """Every rank reads the checkpoint itself (the run directory is shared; with
        torchrun on several machines it must be on a shared file system)."""
        path = checkpoint_path(self.cfg.resume)
        payload = read_checkpoint(self.cfg, path)
        try:
            model.load_state_dict(payload["model"])
        except RuntimeError:
            raise CheckpointError(f"{path}: parameters do not match this model") from None
        mine = RankState.from_tensors(payload["ranks"][self.rank])
        _fill(state_tensors(state), payload["rule_state"] if self.shared else mine.rule_state,
              path)
        mine.apply(aug_gen, counter, path, self.rank)
        if compression is not None and compression.active and payload["comm"]:
            # (none: a checkpoint resized to another group size; residuals belong to the
            # old ranks, so error feedback starts afresh)
            try:
                compression.load_state(payload["comm"][self.rank], device)
            except ValueError as e:
                raise CheckpointError(f"{path}: rank {self.rank}'s {e}") from None
        pos = Position(payload["step"], payload["epoch"], payload["samples"], payload["rounds"],
                       payload["wall_s"])
        self.log.log("resume", step=pos.step, epoch=pos.epoch, samples=pos.samples * self.world)
        return pos


def check_resume(cfg: RunConfig) -> None:
    """Before any process starts (``--resume DIR``): the checkpoint exists, passes its
    checksum and belongs to this run."""
    read_checkpoint(cfg)


def has_checkpoint(cfg: RunConfig) -> bool:
    """For a launcher restarting a group: is there a checkpoint of this run to resume?"""
    return checkpoint_path(cfg.out).is_file()


def injected_kills(events: Path, offset: int) -> list[dict[str, Any]]:
    """``fault`` events written to ``events`` after byte ``offset`` (this launch's)."""
    if not events.is_file():
        return []
    with open(events, "rb") as f:
        f.seek(offset)
        lines = f.read().decode(errors="replace").splitlines()
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("kind") == "fault":
            out.append(record)
    return out


def spawn_workers(job, process_main, world: int, backend: str = "gloo",
                  rank_name: str = "worker") -> None:
    """``spawn`` the workers; a run stopped by ``--kill-worker`` ends with one line naming
    the killed worker (its peers' connection errors are consequences, not the cause) and
    how to continue it."""
    events = job.run_dir / "events.jsonl"
    offset = events.stat().st_size if events.is_file() else 0
    t0 = time.time()
    try:
        spawn(process_main, world, (job,), backend=backend,
              name=lambda rank: f"{rank_name} {rank}")
    except WorkerFailed:
        kills = injected_kills(events, offset)
        if not kills:
            raise
        kill = kills[0]
        ckpt = checkpoint_path(job.run_dir)
        if ckpt.is_file() and ckpt.stat().st_mtime >= t0:
            then = (f"`phalanx train --resume {job.run_dir}` continues it from its last "
                    "checkpoint")
        else:
            then = "no checkpoint was written yet (--checkpoint-every K)"
        raise WorkerFailed(
            f"worker {kill.get('worker')} was killed at {kill.get('at')} (--kill-worker) and "
            f"the run stopped; {then}; under torchrun --max-restarts the group restarts "
            "by itself") from None
