"""Shard checkpoints: every ``--checkpoint-every K`` updates a shard writes its whole state
(parameters, optimizer state, version, every worker's clock, counters) to
``RUN_DIR/ps_shard{K}.ckpt``; ``phalanx train --resume RUN_DIR`` restores it.

Files are written with :func:`phalanx.runtime.checkpoint.save_checkpoint` (temp file +
rename: a crash mid-write leaves the previous checkpoint; SHA-256 checksum) and read with
``weights_only=True``. Everything read back is checked against the run (shard, sizes,
dtypes, optimizer-state shapes) before it replaces anything: a checkpoint of another run
or a damaged one is refused with one line naming the file.

The periodic checkpoint is taken right after an update (an empty buffer). A stop
(SIGTERM: a scheduler's preemption, or the driver ending the run) checkpoints whenever it
comes: the pushes waiting in the buffer (a half-collected BSP / SoftSync round) are saved
with it and put back on ``--resume``, so none is lost or applied twice.

Workers dropped as dead (``--on-worker-loss continue``) are saved with their clocks. A
resumed shard keeps them out: the run goes on with the workers it had when it stopped,
exactly as it would have without the stop (same barriers, same bounds; a lost worker's
clock is behind, and taking it back would hold BSP / SSP back until it caught up). Its
restarted process is told so by its first pull and leaves at once
(:data:`~phalanx.comm.wire.Kind.LEFT`).

Fields added after the first version (``pending``, ``lost``) are optional on reading: an
older checkpoint has an empty buffer and no lost worker.
"""

from __future__ import annotations

from pathlib import Path

import torch

from phalanx.ps.shard import Pending, ShardState
from phalanx.rules import state_tensors
from phalanx.runtime.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

FORMAT = "phalanx-ps-shard/1"
COUNTERS = ("pushes_applied", "pushes_rejected", "messages_rejected", "updates",
            "pushes_lost", "duplicates")


def shard_path(run_dir: str | Path, shard: int) -> Path:
    return Path(run_dir) / f"ps_shard{shard}.ckpt"


def save_shard(state: ShardState, path: Path, *, servers: int, strategy: str) -> None:
    state.settle()  # an update still running on the shard's update thread is in it
    rows = state.rows if state.rows is not None else torch.zeros(0)
    empty = torch.zeros(0)
    save_checkpoint(path, {
        "format": FORMAT,
        "shard": state.shard,
        "servers": servers,
        "workers": state.workers,
        "strategy": strategy,
        "version": state.version,
        "clocks": torch.tensor(state.clocks, dtype=torch.int64),
        "dense": state.dense.clone(),
        "rows": rows.clone(),
        "dense_state": [t.clone() for t in state_tensors(state.dense_state)],
        "rows_state": [t.clone() for t in state_tensors(state.rows_state)]
        if state.rows_state is not None else [],
        "counters": torch.tensor([getattr(state.stats, c) for c in COUNTERS], dtype=torch.int64),
        "staleness": torch.tensor(state.stats.histogram(), dtype=torch.int64),
        # the buffer: (worker, clock, version, has a gradient) + the payloads of each push
        "pending": torch.tensor([[p.worker, p.clock, p.version, p.dense is not None]
                                 for p in state.buffer], dtype=torch.int64).reshape(-1, 4),
        "pending_tensors": [t.clone() if t is not None else empty for p in state.buffer
                            for t in (p.dense, p.ids, p.rows)],
        "lost": torch.tensor(sorted(state.lost_workers.items()),
                             dtype=torch.int64).reshape(-1, 2),
    })


def read_shard(path: Path, *, shard: int, servers: int, workers: int,
               strategy: str) -> dict:
    """Load and check that ``path`` is shard ``shard`` of a run with these settings."""
    payload = load_checkpoint(path)

    def need(cond: bool, what: str) -> None:
        if not cond:
            raise CheckpointError(f"{path}: {what}")

    need(payload.get("format") == FORMAT, "not a parameter-server shard checkpoint")
    need(payload.get("shard") == shard and payload.get("servers") == servers
         and payload.get("workers") == workers,
         f"written by shard {payload.get('shard')} of {payload.get('servers')} with "
         f"{payload.get('workers')} workers, not shard {shard} of {servers} with {workers}")
    need(payload.get("strategy") == strategy,
         f"written by --strategy {payload.get('strategy')}, not {strategy}")
    for key in ("clocks", "dense", "rows", "counters", "staleness"):
        need(isinstance(payload.get(key), torch.Tensor), f"field {key!r} missing")
    for key in ("dense_state", "rows_state"):
        need(isinstance(payload.get(key), list)
             and all(isinstance(t, torch.Tensor) for t in payload[key]), f"field {key!r} missing")
    need(isinstance(payload.get("version"), int) and payload["version"] >= 0, "bad version")
    need(payload["clocks"].shape == (workers,) and int(payload["clocks"].min()) >= 0,
         "bad worker clocks")
    need(payload["counters"].shape == (len(COUNTERS),) and int(payload["counters"].min()) >= 0,
         "bad counters")
    need(payload["staleness"].dim() == 1 and (payload["staleness"].numel() == 0
                                              or int(payload["staleness"].min()) >= 0),
         "bad staleness histogram")
    pending = payload.setdefault("pending", torch.zeros(0, 4, dtype=torch.int64))
    tensors = payload.setdefault("pending_tensors", [])
    need(isinstance(pending, torch.Tensor) and pending.dtype == torch.int64
         and pending.dim() == 2 and pending.shape[1] == 4
         and isinstance(tensors, list) and len(tensors) == 3 * len(pending)
         and all(isinstance(t, torch.Tensor) for t in tensors)
         and (not len(pending) or (int(pending[:, :3].min()) >= 0
                                   and int(pending[:, 0].max()) < workers)),
         "bad buffered pushes")
    lost = payload.setdefault("lost", torch.zeros(0, 2, dtype=torch.int64))
    need(isinstance(lost, torch.Tensor) and lost.dtype == torch.int64 and lost.dim() == 2
         and lost.shape[1] == 2 and (not len(lost) or (int(lost.min()) >= 0
                                                       and int(lost[:, 0].max()) < workers)),
         "bad lost workers")
    return payload


def restore_shard(state: ShardState, payload: dict, path: Path) -> None:
    """Put a checked checkpoint's contents into a freshly built shard (same settings)."""
    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.dtype == b.dtype and a.shape == b.shape

    rows = state.rows if state.rows is not None else torch.zeros(0)
    if not same(payload["dense"], state.dense) or not same(payload["rows"], rows):
        raise CheckpointError(f"{path}: parameters do not match this model")
    for name, current in (("dense_state", state.dense_state), ("rows_state", state.rows_state)):
        template = state_tensors(current) if current is not None else []
        saved = payload[name]
        if len(saved) != len(template) or not all(map(same, saved, template)):
            raise CheckpointError(f"{path}: optimizer state does not match --rule")
    with torch.no_grad():
        state.dense.copy_(payload["dense"])
        if state.rows is not None:
            state.rows.copy_(payload["rows"])
        for name, current in (("dense_state", state.dense_state),
                              ("rows_state", state.rows_state)):
            for t, v in zip(state_tensors(current) if current is not None else [],
                            payload[name]):
                t.copy_(v)  # rule states are tuples of tensors: fill them in place
    state.version = payload["version"]
    state.clocks = [int(c) for c in payload["clocks"]]
    for name, value in zip(COUNTERS, payload["counters"].tolist()):
        setattr(state.stats, name, int(value))
    state.stats.staleness.clear()
    for s, count in enumerate(payload["staleness"].tolist()):
        if count:
            state.stats.staleness[s] = int(count)
    state.buffer = [_pending(row, payload["pending_tensors"][3 * i : 3 * i + 3], state, path)
                    for i, row in enumerate(payload["pending"].tolist())]
    for w, clock in payload["lost"].tolist():
        state.active.discard(w)
        state.lost_workers[w] = clock
    state.stats.workers_lost = len(state.lost_workers)


def _pending(row: list[int], tensors: list[torch.Tensor], state: ShardState,
             path: Path) -> Pending:
    """One buffered push read back (its gradient checked against the shard's slice)."""
    worker, clock, version, has_grad = row
    if not has_grad:
        return Pending(worker, clock, version)  # a rejected or lost push: counts, no payload
    dense, ids, rows = tensors
    if dense.dtype != state.dense.dtype or dense.shape != state.dense.shape:
        raise CheckpointError(f"{path}: a buffered push does not match this model")
    with_rows = ids.numel() > 0 or rows.numel() > 0
    return Pending(worker, clock, version, dense, ids if with_rows else None,
                   rows if with_rows else None)
