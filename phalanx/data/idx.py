"""IDX (MNIST-format) reader, gzip or raw. Fashion-MNIST and MNIST use it."""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from phalanx.errors import DataError
from phalanx.limits import available_memory_bytes, memory_bytes

# third byte of the magic number -> numpy dtype (big-endian on disk)
_IDX_TYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


# deflate cannot expand data more than ~1032:1; a header that claims more than this many
# bytes per byte of gzip file is lying (a "gzip bomb" or a corrupt header)
GZIP_MAX_RATIO = 1100
FLOAT_COPIES = 3


def read_idx(path: str | Path, limit: int = 0) -> np.ndarray:
    """Read one IDX file and return its array (shape from the header); ``limit`` > 0 reads
    only the first ``limit`` items along the first dimension.

    What the header claims is checked against the file's real size (raw) or what a gzip
    file of that size can hold, and against this machine's memory, before anything is
    allocated; the data is then streamed, so a lying header costs nothing."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            gz = f.read(2) == b"\x1f\x8b"
            f.seek(0)
            stream = gzip.GzipFile(fileobj=f) if gz else f
            return _read_stream(path, stream, size, gz, limit)
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise DataError(f"{path}: corrupt gzip data ({e})") from None


def _read_stream(path: Path, stream, size: int, gz: bool, limit: int) -> np.ndarray:
    head = stream.read(4)
    if len(head) < 4:
        raise DataError(f"{path}: truncated IDX header ({len(head)} bytes)")
    zero1, zero2, type_code, ndim = head
    if zero1 != 0 or zero2 != 0 or type_code not in _IDX_TYPES or not 1 <= ndim <= 4:
        raise DataError(f"{path}: not an IDX file (bad magic number {head.hex()})")
    dims = stream.read(4 * ndim)
    if len(dims) < 4 * ndim:
        raise DataError(f"{path}: truncated IDX header")
    header_len = 4 + 4 * ndim
    shape = struct.unpack(">" + "I" * ndim, dims)
    dtype = _IDX_TYPES[type_code]
    expected = math.prod(shape) * dtype.itemsize  # Python ints: no int64 wrap-around
    if gz and expected > GZIP_MAX_RATIO * size + 4096:
        raise DataError(f"{path}: header says {shape} ({expected} bytes), more than a "
                        f"{size}-byte gzip file can hold (corrupt header or gzip bomb)")
    if not gz and size - header_len < expected:
        raise DataError(f"{path}: truncated: header says {shape} ({expected} bytes), "
                        f"file has {size - header_len}")
    if not gz and size - header_len > expected:
        raise DataError(f"{path}: {size - header_len - expected} unexpected trailing bytes "
                        f"after {shape}")
    keep = min(shape[0], limit) if limit > 0 else shape[0]
    want = keep * math.prod(shape[1:]) * dtype.itemsize
    # the data becomes float32 tensors: refuse what cannot fit before inflating any of it.
    # Loading holds about FLOAT_COPIES float32 copies at its peak (the converted array, its
    # normalised tensor, the raw bytes), and a header that declares gigabytes of zeros
    # deflates ~1000:1, so a few MB of gzip can claim them (a gzip bomb)
    as_float = keep * math.prod(shape[1:]) * 4
    free = min(memory_bytes() // 2, available_memory_bytes())
    if as_float * FLOAT_COPIES > free:
        raise DataError(f"{path}: {shape} would need {as_float * FLOAT_COPIES / 2**30:.1f} GiB "
                        f"to load, more than the {free / 2**30:.1f} GiB this machine has free "
                        f"(use --train-limit / --test-limit)")
    body = stream.read(want)
    if len(body) < want:
        raise DataError(f"{path}: truncated: header says {shape} ({expected} bytes), "
                        f"file has {len(body)}")
    if keep == shape[0] and gz and stream.read(1):
        raise DataError(f"{path}: unexpected trailing bytes after {shape}")
    arr = np.frombuffer(body, dtype=dtype, count=want // dtype.itemsize)
    return arr.reshape((keep, *shape[1:])).astype(dtype.newbyteorder("="), copy=True)


def write_idx(path: str | Path, array: np.ndarray, compress: bool | None = None) -> None:
    """Write an array as IDX (gzip when the name ends in .gz). Used by tests and tools."""
    path = Path(path)
    codes = {v.newbyteorder("=").str: k for k, v in _IDX_TYPES.items()}
    native = array.dtype.newbyteorder("=")
    code = codes.get(native.str)
    if code is None:
        raise ValueError(f"IDX cannot store dtype {array.dtype}")
    header = bytes([0, 0, code, array.ndim]) + struct.pack(">" + "I" * array.ndim, *array.shape)
    body = array.astype(_IDX_TYPES[code], copy=False).tobytes()
    blob = header + body
    if compress if compress is not None else path.suffix == ".gz":
        blob = gzip.compress(blob)
    path.write_bytes(blob)


def _find(data_dir: Path, stem: str) -> Path:
    for candidate in (data_dir / f"{stem}.gz", data_dir / stem):
        if candidate.is_file():
            return candidate
    raise DataError(f"{data_dir / (stem + '.gz')}: no such file (nor {stem} uncompressed)")


def load_idx_split(data_dir: str | Path, train: bool,
                   limit: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 28, 28) uint8 and labels (N,) of an MNIST-layout directory (the first
    ``limit`` of them when ``limit`` > 0: the rest is not read)."""
    data_dir = Path(data_dir)
    prefix = "train" if train else "t10k"
    img_path = _find(data_dir, f"{prefix}-images-idx3-ubyte")
    lab_path = _find(data_dir, f"{prefix}-labels-idx1-ubyte")
    images, labels = read_idx(img_path, limit), read_idx(lab_path, limit)
    if images.ndim != 3:
        raise DataError(f"{img_path}: expected 3 dimensions (N, H, W), got shape {images.shape}")
    if images.shape[0] and not (1 <= images.shape[1] <= 4096 and 1 <= images.shape[2] <= 4096):
        raise DataError(f"{img_path}: image size {images.shape[1]}x{images.shape[2]} is not "
                        "in 1..4096")
    if labels.ndim != 1:
        raise DataError(f"{lab_path}: expected 1 dimension (N,), got shape {labels.shape}")
    if len(images) != len(labels):
        raise DataError(f"{lab_path}: {len(labels)} labels for {len(images)} images in {img_path}")
    if labels.dtype.kind == "f" and labels.size and not (
            np.isfinite(labels).all() and (labels == np.round(labels)).all()):
        raise DataError(f"{lab_path}: labels must be whole numbers 0..9, found NaN, inf or "
                        "a fraction")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DataError(f"{lab_path}: labels must be 0..9, found {labels.min()}..{labels.max()}")
    return images, labels.astype(np.int64)
