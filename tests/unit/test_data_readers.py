"""IDX and CIFAR-10 readers on files the tests write themselves, corrupt files included."""

import gzip

import numpy as np
import pytest
import torch

from phalanx.data import load_data
from phalanx.data.cifar import RECORD, load_cifar_split, read_cifar_batch
from phalanx.data.idx import load_idx_split, read_idx, write_idx
from phalanx.errors import DataError


def _write_mnist_dir(d, n_train=50, n_test=20, compress=True, seed=0):
    rng = np.random.default_rng(seed)
    ext = ".gz" if compress else ""
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(d / f"{prefix}-images-idx3-ubyte{ext}",
                  rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8))
        write_idx(d / f"{prefix}-labels-idx1-ubyte{ext}",
                  rng.integers(0, 10, size=n, dtype=np.uint8))


@pytest.mark.parametrize("compress", [True, False])
def test_idx_round_trip(tmp_path, compress):
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / ("a.idx.gz" if compress else "a.idx")
    write_idx(path, arr)
    np.testing.assert_array_equal(read_idx(path), arr)


def test_idx_other_dtypes(tmp_path):
    arr = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    write_idx(tmp_path / "f.idx", arr)
    np.testing.assert_array_equal(read_idx(tmp_path / "f.idx"), arr)


def test_load_mnist_layout_dir(tmp_path):
    _write_mnist_dir(tmp_path, compress=True)
    x, y = load_idx_split(tmp_path, train=True)
    assert x.shape == (50, 28, 28) and y.shape == (50,) and y.dtype == np.int64
    train, test = load_data("idx", str(tmp_path))
    assert train.x.shape == (50, 1, 28, 28) and test.x.shape == (20, 1, 28, 28)
    assert abs(train.x.mean().item()) < 1e-4  # normalised with the training statistics


def test_uncompressed_dir_works(tmp_path):
    _write_mnist_dir(tmp_path, compress=False)
    train, _ = load_data("mnist", str(tmp_path))
    assert len(train) == 50


def test_missing_file_names_it(tmp_path):
    _write_mnist_dir(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte"):
        load_data("idx", str(tmp_path))


def test_missing_dir(tmp_path):
    with pytest.raises(DataError, match="no such directory"):
        load_data("fashion-mnist", str(tmp_path / "nope"))


def test_truncated_idx(tmp_path):
    _write_mnist_dir(tmp_path, compress=False)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte: truncated"):
        read_idx(path)


def test_truncated_header(tmp_path):
    path = tmp_path / "x.idx"
    path.write_bytes(b"\x00\x00\x08\x03\x00\x00")
    with pytest.raises(DataError, match="truncated IDX header"):
        read_idx(path)


def test_bad_magic(tmp_path):
    path = tmp_path / "x.idx"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(DataError, match="bad magic"):
        read_idx(path)


def test_corrupt_gzip(tmp_path):
    path = tmp_path / "x.idx.gz"
    good = gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x05" + bytes(5))
    path.write_bytes(good[:-12])  # cut off the gzip trailer
    with pytest.raises(DataError, match="corrupt gzip"):
        read_idx(path)


def test_labels_images_count_mismatch(tmp_path):
    _write_mnist_dir(tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(49, dtype=np.uint8))
    with pytest.raises(DataError, match="49 labels for 50 images"):
        load_idx_split(tmp_path, train=True)


def test_label_out_of_range(tmp_path):
    _write_mnist_dir(tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.full(50, 12, dtype=np.uint8))
    with pytest.raises(DataError, match="labels must be 0..9"):
        load_idx_split(tmp_path, train=True)


def _write_cifar(path, n, seed=0):
    rng = np.random.default_rng(seed)
    records = rng.integers(0, 256, size=(n, RECORD), dtype=np.uint8)
    records[:, 0] = rng.integers(0, 10, size=n)
    records.tofile(path)
    return records


def test_cifar_reader(tmp_path):
    recs = _write_cifar(tmp_path / "data_batch_1.bin", 7)
    _write_cifar(tmp_path / "data_batch_2.bin", 5, seed=1)
    _write_cifar(tmp_path / "test_batch.bin", 4, seed=2)
    x, y = read_cifar_batch(tmp_path / "data_batch_1.bin")
    assert x.shape == (7, 3, 32, 32)
    np.testing.assert_array_equal(y, recs[:, 0])
    np.testing.assert_array_equal(x[3, 1].reshape(-1), recs[3, 1 + 1024 : 1 + 2048])
    tx, _ = load_cifar_split(tmp_path, train=True)
    assert len(tx) == 12
    train, test = load_data("cifar10", str(tmp_path))
    assert train.x.shape == (12, 3, 32, 32) and len(test) == 4


def test_cifar_truncated(tmp_path):
    path = tmp_path / "data_batch_1.bin"
    _write_cifar(path, 3)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(DataError, match="data_batch_1.bin: truncated or corrupt"):
        read_cifar_batch(path)


def test_cifar_bad_label(tmp_path):
    path = tmp_path / "test_batch.bin"
    recs = np.zeros((2, RECORD), dtype=np.uint8)
    recs[1, 0] = 200
    recs.tofile(path)
    with pytest.raises(DataError, match="label 200"):
        read_cifar_batch(path)


def test_synthetic_and_digits_are_deterministic():
    a, _ = load_data("synthetic", seed=3)
    b, _ = load_data("synthetic", seed=3)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    d, dt = load_data("digits")
    assert d.x.shape[1:] == (1, 8, 8) and len(d) + len(dt) == 1797


def test_unknown_dataset():
    with pytest.raises(DataError, match="'nope' is not one of"):
        load_data("nope")
