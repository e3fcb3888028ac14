"""Checkpoints: atomic (temp file + rename), checksummed, loaded with ``weights_only=True``.

File layout: ``PHXCKPT1`` (8 bytes) + SHA-256 of the payload (32 bytes) + the payload
(``torch.save`` of a dict of tensors / numbers / strings). A torn or altered file fails the
checksum and is refused with a one-line error; nothing is unpickled before that check.
"""

from __future__ import annotations

import hashlib
import io
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from phalanx.errors import PhalanxError
from phalanx.limits import memory_bytes

MAGIC = b"PHXCKPT1"


class CheckpointError(PhalanxError):
    pass


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(payload, buf)
    body = buf.getvalue()
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(MAGIC + hashlib.sha256(body).digest() + body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # atomic on POSIX: readers see the old or the new file, never half


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint")
    if path.stat().st_size > memory_bytes() // 2:
        raise CheckpointError(f"{path}: {path.stat().st_size} bytes, more than half of this "
                              "machine's memory: not a checkpoint of this run")
    blob = path.read_bytes()
    if len(blob) < 40 or blob[:8] != MAGIC:
        raise CheckpointError(f"{path}: not a phalanx checkpoint (bad header)")
    digest, body = blob[8:40], blob[40:]
    if hashlib.sha256(body).digest() != digest:
        raise CheckpointError(f"{path}: checksum mismatch (truncated or corrupt checkpoint)")
    try:
        with warnings.catch_warnings():
            # torch warns on a legacy (bare pickle) payload before refusing it: the one
            # error line below says what is wrong
            warnings.simplefilter("ignore")
            payload = torch.load(io.BytesIO(body), weights_only=True)
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(
            f"{path}: unreadable checkpoint payload ({type(e).__name__})") from None
    if not isinstance(payload, dict):
        raise CheckpointError(f"{path}: checkpoint payload is not a mapping")
    return payload
