"""CIFAR-10 binary-batch reader (``data_batch_{1..5}.bin``, ``test_batch.bin``).

Each record is 1 label byte followed by 3072 bytes of a 32x32 RGB image (channel-major).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from phalanx.errors import DataError
from phalanx.limits import memory_bytes

RECORD = 1 + 3 * 32 * 32


def read_cifar_batch(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    size = path.stat().st_size
    if size * 4 > memory_bytes() // 2:  # held as float32 once loaded
        raise DataError(f"{path}: {size} bytes would need more than half of this machine's "
                        "memory as float32")
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % RECORD:
        raise DataError(
            f"{path}: truncated or corrupt: {raw.size} bytes is not a multiple of {RECORD}"
        )
    records = raw.reshape(-1, RECORD)
    labels = records[:, 0].astype(np.int64)
    if labels.max() > 9:
        raise DataError(f"{path}: label {labels.max()} out of range 0..9")
    images = records[:, 1:].reshape(-1, 3, 32, 32).copy()
    return images, labels


def load_cifar_split(data_dir: str | Path, train: bool) -> tuple[np.ndarray, np.ndarray]:
    data_dir = Path(data_dir)
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] if train else ["test_batch.bin"]
    present = [data_dir / n for n in names if (data_dir / n).is_file()]
    if not present:
        raise DataError(f"{data_dir / names[0]}: no such file (CIFAR-10 binary batches expected)")
    parts = [read_cifar_batch(p) for p in present]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
