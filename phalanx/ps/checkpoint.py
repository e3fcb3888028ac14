"""Shard checkpoints: every ``--checkpoint-every K`` updates a shard writes its whole state
(parameters, optimizer state, version, every worker's clock, counters) to
``RUN_DIR/ps_shard{K}.ckpt``; ``phalanx train --resume RUN_DIR`` restores it.

Files are written with :func:`phalanx.runtime.checkpoint.save_checkpoint` (temp file +
rename: a crash mid-write leaves the previous checkpoint; SHA-256 checksum) and read with
``weights_only=True``. Everything read back is checked against the run (shard, sizes,
dtypes, optimizer-state shapes) before it replaces anything: a checkpoint of another run
or a damaged one is refused with one line naming the file.

A checkpoint is taken only when the shard's buffer is empty (right after an update), so
there are no half-collected BSP / SoftSync rounds to save.
"""

from __future__ import annotations

from pathlib import Path

import torch

from phalanx.ps.shard import ShardState
from phalanx.rules import state_tensors
from phalanx.runtime.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

FORMAT = "phalanx-ps-shard/1"
COUNTERS = ("pushes_applied", "pushes_rejected", "messages_rejected", "updates",
            "pushes_lost", "duplicates")


def shard_path(run_dir: str | Path, shard: int) -> Path:
    return Path(run_dir) / f"ps_shard{shard}.ckpt"


def save_shard(state: ShardState, path: Path, *, servers: int, strategy: str) -> None:
    if state.buffer:
        raise RuntimeError("a shard is checkpointed only with an empty buffer")
    state.settle()  # an update still running on the shard's update thread is in it
    rows = state.rows if state.rows is not None else torch.zeros(0)
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
