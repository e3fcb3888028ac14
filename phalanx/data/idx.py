"""IDX (MNIST-format) reader, gzip or raw. Fashion-MNIST and MNIST use it."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from phalanx.errors import DataError

# third byte of the magic number -> numpy dtype (big-endian on disk)
_IDX_TYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _read_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            return gzip.decompress(raw)
        return raw
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"{path}: corrupt gzip data ({e})") from None


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file and return its array (shape from the header)."""
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise DataError(f"{path}: truncated IDX header ({len(data)} bytes)")
    zero1, zero2, type_code, ndim = data[0], data[1], data[2], data[3]
    if zero1 != 0 or zero2 != 0 or type_code not in _IDX_TYPES or not 1 <= ndim <= 4:
        raise DataError(f"{path}: not an IDX file (bad magic number {data[:4].hex()})")
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise DataError(f"{path}: truncated IDX header")
    shape = struct.unpack(">" + "I" * ndim, data[4:header_len])
    dtype = _IDX_TYPES[type_code]
    expected = int(np.prod(shape)) * dtype.itemsize
    body = len(data) - header_len
    if body < expected:
        raise DataError(
            f"{path}: truncated: header says {shape} ({expected} bytes), file has {body}")
    if body > expected:
        raise DataError(f"{path}: {body - expected} unexpected trailing bytes after {shape}")
    arr = np.frombuffer(data, dtype=dtype, count=int(np.prod(shape)), offset=header_len)
    return arr.reshape(shape).astype(dtype.newbyteorder("="), copy=True)


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


def load_idx_split(data_dir: str | Path, train: bool) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 28, 28) uint8 and labels (N,) of an MNIST-layout directory."""
    data_dir = Path(data_dir)
    prefix = "train" if train else "t10k"
    img_path = _find(data_dir, f"{prefix}-images-idx3-ubyte")
    lab_path = _find(data_dir, f"{prefix}-labels-idx1-ubyte")
    images, labels = read_idx(img_path), read_idx(lab_path)
    if images.ndim != 3:
        raise DataError(f"{img_path}: expected 3 dimensions (N, H, W), got shape {images.shape}")
    if labels.ndim != 1:
        raise DataError(f"{lab_path}: expected 1 dimension (N,), got shape {labels.shape}")
    if len(images) != len(labels):
        raise DataError(f"{lab_path}: {len(labels)} labels for {len(images)} images in {img_path}")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DataError(f"{lab_path}: labels must be 0..9, found {labels.min()}..{labels.max()}")
    return images, labels.astype(np.int64)
