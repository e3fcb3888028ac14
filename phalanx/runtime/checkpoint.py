"""Checkpoints: atomic (temp file + rename), checksummed, loaded with ``weights_only=True``.

File layout: ``PHXCKPT1`` (8 bytes) + SHA-256 of the payload (32 bytes) + the payload
(``torch.save`` of a dict of tensors / numbers / strings). A torn or altered file fails the
checksum and is refused with a one-line error; nothing is unpickled before that check.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from phalanx.errors import PhalanxError
from phalanx.limits import memory_bytes
from phalanx.runtime.signals import pid_alive

MAGIC = b"PHXCKPT1"
_DIGEST = 32  # SHA-256
_HEADER = len(MAGIC) + _DIGEST
_CHUNK = 1 << 20


class CheckpointError(PhalanxError):
    pass


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically, streaming: ``torch.save`` writes straight
    into the temp file behind a placeholder digest, the body is hashed back from the file
    in 1 MiB chunks and the digest written in place. Peak extra memory is a chunk, not
    the ~3 copies of the payload a ``BytesIO`` + ``getvalue`` + concatenation held (rank
    0's whole-model result then cost ~16Psi, DDP's footprint, under every ZeRO stage)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _sweep_dead_temps(path)
        with open(tmp, "w+b") as f:
            f.write(MAGIC + bytes(_DIGEST))  # the digest is written once the body is
            body = _Writes(f)
            try:
                torch.save(payload, body)     # torch's zip writer streams each record
            except RuntimeError:
                if body.error is not None:    # torch reports a failed write as a
                    raise body.error from None  # RuntimeError ("unexpected pos ...")
                raise
            f.flush()
            f.seek(_HEADER)
            h = hashlib.sha256()
            while chunk := f.read(_CHUNK):
                h.update(chunk)
            f.seek(len(MAGIC))
            f.write(h.digest())
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:
        tmp.unlink(missing_ok=True)  # never leave a half-written temp file behind
        if isinstance(e, OSError):
            raise CheckpointError(_write_failed(path, e)) from None
        raise
    try:
        os.replace(tmp, path)  # atomic on POSIX: readers see the old or the new file, never half
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(_write_failed(path, e)) from None


def _sweep_dead_temps(path: Path) -> None:
    """Remove the temp files of ``path`` that a writer killed mid-write left (a SIGKILL
    gives it no chance to; found by the chaos harness): ``.NAME.tmpPID`` whose PID is gone.
    A live writer's are left alone."""
    for old in path.parent.glob(f".{path.name}.tmp*"):
        pid = old.name.rsplit(".tmp", 1)[1]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            old.unlink(missing_ok=True)


class _Writes:
    """The file as torch's writer sees it, keeping the disk's own error (ENOSPC, EIO, ...)
    that torch turns into an opaque RuntimeError."""

    def __init__(self, f: Any) -> None:
        self.f, self.error = f, None

    def write(self, data: Any) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def _write_failed(path: Path, e: OSError) -> str:
    """One line naming the folder: what the disk said, how much room is left, and that the
    previous checkpoint (if any) is untouched."""
    what = e.strerror or str(e) or type(e).__name__
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        try:
            free = shutil.disk_usage(path.parent).free
            what += f", {free / 2**20:.1f} MiB free"
        except OSError:
            pass
    kept = "the previous one is kept whole" if path.exists() else "no earlier one exists"
    return f"{path.parent}: cannot write checkpoint {path.name} ({what}); {kept}"


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint")
    if path.stat().st_size > memory_bytes() // 2:
        raise CheckpointError(f"{path}: {path.stat().st_size} bytes, more than half of this "
                              "machine's memory: not a checkpoint of this run")
    blob = path.read_bytes()
    if len(blob) < _HEADER or blob[:8] != MAGIC:
        raise CheckpointError(f"{path}: not a phalanx checkpoint (bad header)")
    digest, body = blob[len(MAGIC):_HEADER], blob[_HEADER:]
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
