"""Elastic resize of a stopped zero run (its ``StrategySpec.resize``): another worker count
and per-worker batch.

The shards themselves are not touched: ``--resume`` already re-cuts a checkpoint written by
N workers for the N' it runs on (:func:`phalanx.parallel.zero_checkpoint.reshard`), taking
the number of old shards from the manifest and the new one from ``config.json``. What a
resize changes is what depends on the batch and the worker count:

* the position is kept *in epochs*, as sync's resize keeps it (the same epoch, the same
  fraction of it, in the new shards' micro-batches): the manifest's step and epoch are
  converted, and every rank's shard file is rewritten under the new step's name (the
  manifest names its shards by step), the new files first and the manifest last, so a
  crash at any moment leaves a manifest whose shard files are all there;
* the manifest gets the fingerprint of the new settings (the batch and the learning rate
  are in it; the worker count is not), so ``--resume`` accepts it and checks it as always;
* ``config.json`` gets the new ``workers``, ``batch_size`` and ``lr`` (a run on its
  strategy's default rule takes a fresh N'-worker run's rate, as sync's).

The samples counted so far stay in the old ranks' terms: the resume spreads them over the
new ranks, as it does for any resume at another N.
"""

from __future__ import annotations

from phalanx.config import RunConfig
from phalanx.data import same_place
from phalanx.errors import ConfigError
from phalanx.parallel.base import Job
from phalanx.parallel.dp_checkpoint import checkpoint_path
from phalanx.parallel.resize_base import micro_per_epoch, write_config
from phalanx.parallel.spec import Resize
from phalanx.parallel.zero_checkpoint import fingerprint, read, shard_path
from phalanx.runtime.checkpoint import CheckpointError, save_checkpoint


def rewrite(job: Job, new: RunConfig) -> tuple[int, int]:
    """Rewrite the stopped zero run in ``job.run_dir`` for ``new``; returns (old step, new
    step)."""
    old, run_dir = job.config, job.run_dir
    try:
        manifest, shards = read(old)  # the format, the settings, every shard file
    except CheckpointError as e:
        raise ConfigError(f"cannot resize: {e}") from None
    ga = old.grad_accum
    per_old, per_new = micro_per_epoch(run_dir, len(job.train), old, new.workers,
                                       new.batch_size)
    epoch, micro = same_place(manifest["step"] * ga, per_old, per_new)
    step = micro // ga
    was = manifest["step"]
    if step != was:
        for r, s in enumerate(shards):
            save_checkpoint(shard_path(run_dir, step, r), {**s, "step": step})
    save_checkpoint(checkpoint_path(run_dir), {
        **manifest, "fingerprint": fingerprint(new), "step": step, "epoch": epoch})
    if step != was:  # the manifest names the new files: the old ones are no one's
        for r in range(len(shards)):
            shard_path(run_dir, was, r).unlink(missing_ok=True)
    write_config(run_dir, new, ("workers", "batch_size", "lr"))
    return was, step


RESIZE = Resize(rewrite=rewrite)
