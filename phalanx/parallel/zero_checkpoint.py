"""Checkpoints of sharded data parallel (``--strategy zero``): each rank saves its shard,
and a resume at another number of workers re-shards.

Every ``--checkpoint-every K`` steps (and at the last) each rank writes
``RUN_DIR/checkpoint-step{S}-rank{R}.pt``: its fp32 master shard of every unit, the rule's
state of those shards, its RNG streams and byte count. When every rank's file is on disk
(a barrier), rank 0 writes ``RUN_DIR/checkpoint.pt``, the manifest: the step, the data
position, the settings' fingerprint, the units (name, values) and the model's buffers, and
then deletes older steps' shard files. The manifest is written last and atomically, so a
crash at any moment leaves a manifest whose shard files are all there. Files are
checksummed and loaded with ``weights_only=True`` (:mod:`phalanx.runtime.checkpoint`).

A resume at the same N gives each rank its own files back: the run continues the same
trajectory (its data position, RNG streams and byte counts), so it ends on the parameters
of an uninterrupted run. A resume at another N' re-shards (:func:`reshard`): each unit's
saved shards, concatenated, are the unit's padded vector (N x S values, the padding
zeros); cut again into N' shards of S' = ceil(P / N'), rank r' takes ``[r' S', (r'+1)
S')``. The rule's per-value state (Adam's moments: 1-D tensors of the shard's length) is
re-sharded the same way; its scalars (the step count) are every rank's alike and taken
from rank 0. Data shards and RNG streams belong to the old ranks: the new ranks draw
their own from the next step on (the trajectory is then a new one, from the saved
state), and the bytes counted so far are spread over the new ranks.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from phalanx.config import RunConfig
from phalanx.parallel.dp_checkpoint import NOT_TRAJECTORY, RankState, checkpoint_path
from phalanx.parallel.loop import Position
from phalanx.rules import state_tensors
from phalanx.runtime.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

FORMAT = "phalanx-zero/1"
SHARD_FILE = re.compile(r"checkpoint-step(\d+)-rank(\d+)\.pt")


def shard_path(run_dir: str | Path, step: int, rank: int) -> Path:
    return Path(run_dir) / f"checkpoint-step{step}-rank{rank}.pt"


def fingerprint(cfg: RunConfig) -> str:
    """The settings that shape the trajectory, less ``--workers``: a resume may re-shard."""
    skip = (*NOT_TRAJECTORY, "workers")
    return json.dumps({k: v for k, v in cfg.to_json().items() if k not in skip},
                      sort_keys=True)


def reshard(saved: list[torch.Tensor], world: int, rank: int, size: int) -> torch.Tensor:
    """Rank ``rank`` of ``world``'s ``size`` values of the vector whose old shards are
    ``saved`` (in old rank order). Beyond the real values both layouts hold zeros (the
    padding), so the vector is cut or zero-padded to ``world x size``."""
    whole = torch.cat([t.reshape(-1) for t in saved])
    want = world * size
    if whole.numel() < want:
        whole = torch.cat([whole, whole.new_zeros(want - whole.numel())])
    return whole[rank * size : (rank + 1) * size].clone()


class ZeroCheckpointer:
    """Saves and restores one rank's part of a zero run (every rank calls both)."""

    def __init__(self, cfg: RunConfig, run_dir: Path, rank: int, world: int, log) -> None:
        self.cfg, self.run_dir, self.rank, self.world, self.log = cfg, run_dir, rank, world, log
        if not cfg.resume and rank == 0:
            # a fresh run: an earlier run's shards here must never be resumed by this one
            # (the manifest itself is removed by the replicas' Checkpointer)
            for p in _shard_files(run_dir):
                p.unlink(missing_ok=True)

    def save(self, hooks, pos: Position) -> None:
        """Collective: this rank's shard file, then (rank 0) the manifest."""
        mine = {"format": FORMAT, "rank": self.rank, "workers": self.world, "step": pos.step,
                "masters": [_compact(u.shard) for u in hooks.units],
                "state": [_compact(t) for t in state_tensors(hooks.state)],
                "rank_state": RankState.capture(hooks.kit.gen, hooks.counter, hooks.state,
                                                shared=True).tensors()}
        save_checkpoint(shard_path(self.run_dir, pos.step, self.rank), mine)
        self._barrier()  # sync point: every shard is on disk before the manifest names it
        if self.rank == 0:
            params = {id(p) for p in hooks.model.parameters()}
            buffers = {k: v.detach().to("cpu", copy=True)
                       for k, v in hooks.model.state_dict(keep_vars=True).items()
                       if id(v) not in params}
            save_checkpoint(checkpoint_path(self.run_dir), {
                "format": FORMAT, "strategy": self.cfg.strategy, "workers": self.world,
                "fingerprint": fingerprint(self.cfg), "step": pos.step, "epoch": pos.epoch,
                "samples": pos.samples, "rounds": pos.rounds, "wall_s": float(pos.wall_s),
                "units": [[u.name, u.layout.numel] for u in hooks.units],
                "buffers": buffers})
            for p in _shard_files(self.run_dir):
                if int(SHARD_FILE.fullmatch(p.name).group(1)) != pos.step:
                    p.unlink(missing_ok=True)  # an older step's: the manifest moved on
            self.log.log("checkpoint", step=pos.step, epoch=pos.epoch)
        self._barrier()  # sync point: a crash from here on resumes from this step

    def restore(self, hooks) -> Position:
        """This rank's shards of the checkpoint in ``--resume``, re-sharded when it was
        written by another number of workers; fills the units' masters, the rule's state,
        the buffers and (same N) the RNG streams and byte count."""
        manifest, shards = read(self.cfg)
        old = manifest["workers"]
        path = checkpoint_path(self.cfg.resume)
        units = [[u.name, u.layout.numel] for u in hooks.units]
        if manifest["units"] != units:
            raise CheckpointError(f"{path}: its units {manifest['units']} are not this "
                                  f"model's {units}")
        with torch.no_grad():
            for i, u in enumerate(hooks.units):
                got = reshard([s["masters"][i] for s in shards], self.world, self.rank,
                              u.shard.numel())
                u.shard.copy_(got.to(u.shard.dtype))
            self._state(hooks.state, shards, path)
        try:
            hooks.model.load_state_dict(manifest["buffers"], strict=False)
        except RuntimeError:
            raise CheckpointError(f"{path}: buffers do not match this model") from None
        if old == self.world:
            RankState.from_tensors(shards[self.rank]["rank_state"]).apply(
                hooks.kit.gen, hooks.counter, path, self.rank)
        else:  # the old ranks' bytes, spread over the new ones
            sent = sum(int(s["rank_state"][2]) for s in shards)
            hooks.counter.sent = sent // self.world + (sent % self.world if self.rank == 0
                                                       else 0)
        # samples are per rank: the old ranks' in the new ranks' terms
        pos = Position(manifest["step"], manifest["epoch"],
                       manifest["samples"] * old // self.world, manifest["rounds"],
                       manifest["wall_s"])
        self.log.log("resume", step=pos.step, epoch=pos.epoch,
                     samples=pos.samples * self.world, workers_saved=old)
        return pos

    def _state(self, state: Any, shards: list[dict], path: Path) -> None:
        targets = state_tensors(state)
        saved = [s["state"] for s in shards]
        if any(len(s) != len(targets) for s in saved):
            raise CheckpointError(f"{path}: optimizer state does not match --rule")
        for i, t in enumerate(targets):
            olds = [s[i] for s in saved]
            if any(o.dtype != t.dtype for o in olds):
                raise CheckpointError(f"{path}: optimizer state does not match --rule")
            if t.dim() == 1:  # per value of the shard: re-sharded
                t.copy_(reshard(olds, self.world, self.rank, t.numel()))
            elif olds[0].shape == t.shape:  # a scalar every rank holds alike (a step count)
                t.copy_(olds[0])
            else:
                raise CheckpointError(f"{path}: optimizer state does not match --rule")

    def _barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def _compact(t: torch.Tensor) -> torch.Tensor:
    """``t`` as torch.save should get it: on the host, and a tensor of its own (a view
    would carry its whole buffer into the file: stage 1's and 2's masters are slices of
    their unit's). A host tensor that is its own storage is not copied: the file is written
    before training goes on, and a copy of every shard and its rule state would be the
    peak of a run's last step."""
    t = t.detach()
    if t.device.type != "cpu":
        return t.to("cpu")
    whole = t.storage_offset() == 0 and t.is_contiguous() \
        and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    return t if whole else t.clone()


def _shard_files(run_dir: Path) -> list[Path]:
    return [p for p in Path(run_dir).glob("checkpoint-step*-rank*.pt")
            if SHARD_FILE.fullmatch(p.name)]


def read(cfg: RunConfig) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The manifest in ``--resume`` and every rank's shard file it names, checked: the
    format, the settings, each file there, intact and of the manifest's step."""
    path = checkpoint_path(cfg.resume or cfg.out)
    manifest = load_checkpoint(path)

    def need(cond: bool, where: Path, what: str) -> None:
        if not cond:
            raise CheckpointError(f"{where}: {what}")

    need(manifest.get("format") == FORMAT, path, "not a zero checkpoint (written by "
         f"--strategy {manifest.get('strategy', '?')})")
    saved = manifest.get("fingerprint")
    if saved != fingerprint(cfg):
        try:
            a, b = json.loads(saved), json.loads(fingerprint(cfg))
            diff = next((k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)), "?")
        except (TypeError, ValueError, AttributeError):
            diff = "?"
        need(False, path, f"written with other settings (--{diff.replace('_', '-')} differs)")
    for key in ("workers", "step", "epoch", "samples", "rounds"):
        need(isinstance(manifest.get(key), int) and manifest[key] >= 0, path, f"bad {key!r}")
    need(manifest["workers"] >= 1, path, "bad 'workers'")
    need(isinstance(manifest.get("wall_s"), float), path, "bad 'wall_s'")
    need(isinstance(manifest.get("units"), list) and isinstance(manifest.get("buffers"), dict),
         path, "fields 'units' / 'buffers' missing")
    shards = []
    for r in range(manifest["workers"]):
        where = shard_path(path.parent, manifest["step"], r)
        if not where.is_file():
            raise CheckpointError(f"{where}: missing: rank {r}'s shard of step "
                                  f"{manifest['step']} (a partial checkpoint)")
        s = load_checkpoint(where)
        need(s.get("format") == FORMAT and s.get("rank") == r
             and s.get("step") == manifest["step"] and s.get("workers") == manifest["workers"],
             where, f"not rank {r}'s shard of step {manifest['step']}")
        need(all(isinstance(s.get(k), list) and all(isinstance(t, torch.Tensor) for t in s[k])
                 for k in ("masters", "state", "rank_state"))
             and len(s["masters"]) == len(manifest["units"]) and len(s["rank_state"]) >= 3,
             where, "bad shard contents")
        shards.append(s)
    return manifest, shards


def check_resume(cfg: RunConfig) -> None:
    """Before any process starts (``--resume DIR``): the manifest and every shard file."""
    read(cfg)
