"""Hostile data files: one DataError line each, before anything large is allocated
(issue 18, cause 8)."""

import gzip
import struct
import time

import numpy as np
import pytest

from phalanx.data import load_data
from phalanx.data.idx import load_idx_split, read_idx, write_idx
from phalanx.errors import DataError


def mnist_dir(d, n_train=40, n_test=10, labels_dtype=np.uint8, compress=True):
    ext = ".gz" if compress else ""
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(d / f"{prefix}-images-idx3-ubyte{ext}",
                  rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8))
        write_idx(d / f"{prefix}-labels-idx1-ubyte{ext}",
                  rng.integers(0, 10, size=n).astype(labels_dtype))
    return d


def header(type_code: int, *dims: int) -> bytes:
    return bytes([0, 0, type_code, len(dims)]) + struct.pack(">" + "I" * len(dims), *dims)


def test_corrupt_deflate_stream_is_one_line(tmp_path):
    blob = bytearray(gzip.compress(header(0x08, 50, 28, 28) + bytes(range(256)) * 153))
    blob[len(blob) // 2:len(blob) // 2 + 16] = b"\xff" * 16  # damage inside the deflate data
    (tmp_path / "x.gz").write_bytes(bytes(blob))
    with pytest.raises(DataError, match="x.gz: corrupt gzip data"):
        read_idx(tmp_path / "x.gz")


@pytest.mark.parametrize("compress", [False, True])
def test_dimension_product_past_int64_is_refused(tmp_path, compress):
    # 0xFFFFFFFF^4 x 8 bytes wraps a 64-bit product; the header is compared exactly
    blob = header(0x0E, 2**32 - 1, 2**32 - 1, 2**32 - 1, 2**32 - 1) + b"\0" * 64
    path = tmp_path / ("big.gz" if compress else "big")
    path.write_bytes(gzip.compress(blob) if compress else blob)
    with pytest.raises(DataError, match="truncated|more than a"):
        read_idx(path)


def test_gzip_bomb_header_is_refused_before_reading(tmp_path):
    # 20 KB of gzip whose header claims 60000 x 2048 x 2048 bytes (250 GB)
    path = tmp_path / "bomb.gz"
    path.write_bytes(gzip.compress(header(0x08, 60000, 2048, 2048) + b"\0" * 20_000_000))
    t0 = time.perf_counter()
    with pytest.raises(DataError, match="more than a .*gzip file can hold"):
        read_idx(path)
    assert time.perf_counter() - t0 < 2


def test_train_limit_bounds_what_is_read(tmp_path):
    # a file that claims 20 images but holds 10: with a limit of 10 only those are read
    images = np.random.default_rng(0).integers(0, 256, (10, 28, 28), dtype=np.uint8)
    path = tmp_path / "a.gz"
    path.write_bytes(gzip.compress(header(0x08, 20, 28, 28) + images.tobytes()))
    assert read_idx(path, limit=10).shape == (10, 28, 28)
    with pytest.raises(DataError, match="truncated|corrupt"):
        read_idx(path)


def test_nan_float_labels_are_refused(tmp_path):
    mnist_dir(tmp_path, labels_dtype=np.float32)
    labels = np.zeros(40, dtype=np.float32)
    labels[3] = np.nan
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", labels)
    with pytest.raises(DataError, match="whole numbers 0..9"):
        load_idx_split(tmp_path, train=True)


def test_whole_float_labels_still_load(tmp_path):
    mnist_dir(tmp_path, labels_dtype=np.float32)
    _, y = load_idx_split(tmp_path, train=True)
    assert y.dtype == np.int64 and y.max() <= 9


@pytest.mark.parametrize("n_train,n_test,split", [(40, 0, "test"), (0, 10, "training")])
def test_empty_split_is_one_line(tmp_path, n_train, n_test, split):
    mnist_dir(tmp_path, n_train=n_train, n_test=n_test)
    with pytest.raises(DataError, match=f"the {split} split is empty"):
        load_data("idx", str(tmp_path))


def test_zero_sized_images_are_refused(tmp_path):
    mnist_dir(tmp_path)
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", np.zeros((40, 0, 28), dtype=np.uint8))
    with pytest.raises(DataError, match="image size 0x28"):
        load_idx_split(tmp_path, train=True)
