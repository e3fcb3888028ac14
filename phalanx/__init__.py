"""phalanx: distributed deep learning under every synchronisation protocol, and a
topology-aware scheduler for DL jobs on GPU clusters."""

from __future__ import annotations

import os
import re

# OpenMP threads that wait for work sleep (futex) instead of spinning. torch's intra-op
# threads (libgomp) spin by default; on a machine with more runnable threads than cores,
# as phalanx's ranks, servers and drivers often are, the spinning takes the cores the
# working threads need. bench/threads.py (2 intra-op threads, 2-core machine at load 1.5):
# 8.1x the steps/s beside busy loops, 0.78x on a quiet machine
# (waking a sleeping thread costs more than finding it spinning); GOMP_SPINCOUNT=10000
# measured between (7.4x, 0.85x). Set before torch is imported (libgomp reads it once);
# every process phalanx starts inherits it; a value the user set is kept (export
# OMP_WAIT_POLICY=ACTIVE on a machine of one's own).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from phalanx.config import RunConfig
from phalanx.errors import PhalanxError

__version__ = "0.1.0"


def train(model=None, data=None, *, config=None, **options):
    """Train a model with a synchronisation strategy; return its summary and history.

    Args:
        model: a model name (``"mlp"``, ``"lenet5"``, ``"resnet"``, ``"logreg"``) or a
            factory returning any ``torch.nn.Module`` (picklable when the strategy starts
            processes). Default: ``"lenet5"``.
        data: a data-set name (``"fashion-mnist"``, ``"mnist"``, ``"idx"``, ``"cifar10"``,
            ``"digits"``, ``"synthetic"``) or a ``(train, test)`` pair of
            :class:`phalanx.data.Dataset`. Default: ``"fashion-mnist"``.
        config: a whole :class:`phalanx.config.RunConfig` instead of keywords.
        **options: any ``RunConfig`` field, named as the ``phalanx train`` flag with ``_``
            for ``-``: ``strategy`` (``"single"``, ``"sync"``, ``"asp"``, ...; see
            ``phalanx train --help``), ``workers``, ``epochs``, ``max_steps``,
            ``batch_size``, ``lr``, ``rule``, ``compress``, ``out`` (default
            ``"runs/latest"``), ``overwrite``, ``seed``, ``progress``, ...

    Returns:
        :class:`phalanx.entry.api.RunResult` with ``summary`` (the dict written to
        ``OUT/summary.json``: test accuracy and loss, steady-state ``samples_per_s``,
        ``startup_s``, ``wall_s``, the strategy's statistics), ``history`` (the ``train``
        and ``eval`` events, in order), ``events`` (every event), ``model`` (the trained
        ``nn.Module``) and ``out`` (the run folder).

    Raises:
        phalanx.errors.PhalanxError: a bad setting, data file or run folder, in one line
            that names the keyword argument (e.g. ``overwrite=True``).

    Example::

        >>> import phalanx
        >>> r = phalanx.train("mlp", "synthetic", strategy="sync", workers=2,
        ...                   max_steps=50, out="runs/api-example", overwrite=True)
        >>> r.summary["test_accuracy"] > 0.5, r.history[-1]["kind"]
        (True, 'eval')

    The work is done by :func:`phalanx.entry.api.train`, imported on the first call so
    that ``import phalanx`` stays cheap (no torch).
    """
    from phalanx.entry.api import train as _train

    try:
        return _train(model, data, config=config, **options)
    except PhalanxError as e:
        raise type(e)(as_keywords(str(e))) from None


_FLAG = re.compile(r"--(no-)?([a-z][a-z0-9]*(?:-[a-z0-9]+)*)( (?=[^\s(]))?")


def as_keywords(message: str) -> str:
    """An error written for the command line, reworded for the Python API: ``--out-dir``
    becomes ``out_dir=``, ``--overwrite`` ``overwrite=True``, ``--no-progress``
    ``progress=False`` (the run's settings only; other flags are left as they are)."""
    fields = RunConfig.__dataclass_fields__

    def keyword(m: re.Match) -> str:
        name = m.group(2).replace("-", "_")
        if name not in fields:
            return m.group(0)
        if fields[name].type in ("bool", bool):
            return f"{name}={'False' if m.group(1) else 'True'}" + (m.group(3) or "")
        return f"{name}=" if m.group(3) else name  # "out=/tmp/x", "epochs: 0 must be > 0"

    # a command quoted in `backticks` is a command line: it keeps its flags
    parts = message.split("`")
    return "`".join(p if i % 2 else _FLAG.sub(keyword, p) for i, p in enumerate(parts))


__all__ = ["train", "__version__"]
