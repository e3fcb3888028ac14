"""Data sets by name, normalised into in-memory tensors.

Everything is loaded once into memory as float32 tensors (N, C, H, W): Fashion-MNIST is
188 MB that way, and indexing a tensor by a batch of ids is several times faster than a
DataLoader on 2 cores.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from phalanx.catalog import Catalog
from phalanx.data.cifar import load_cifar_split
from phalanx.data.ctr import TEST_SAMPLES, TRAIN_SAMPLES, click_log
from phalanx.data.idx import load_idx_split
from phalanx.data.text import text_splits
from phalanx.errors import ConfigError, DataError

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"


@dataclass
class Dataset:
    """Features ``x`` and targets ``y``, by ``task``:

    - ``classify``: images (N, C, H, W) float32, normalised; labels (N,) int64;
    - ``lm``: token windows (N, T) int64 and the next token at each position (N, T) int64;
      ``num_classes`` is the vocabulary; ``vocab`` decodes a token (characters; empty: bytes);
    - ``ctr``: dense features and hashed ids side by side (N, D + F) float32 (ids are exact
      integers below 2**24); clicks (N,) int64 in {0, 1}.

    Every strategy sees ``x[idx]`` / ``y[idx]`` and a loss over the last dimension
    (:func:`phalanx.models.loss.token_cross_entropy`), so none of them branches on it."""

    name: str
    x: torch.Tensor
    y: torch.Tensor
    num_classes: int
    task: str = "classify"
    vocab: str = ""
    info: dict = dataclasses.field(default_factory=dict)  # what a report says of the data

    def __len__(self) -> int:
        return len(self.y)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def subset(self, limit: int) -> Dataset:
        if limit <= 0 or limit >= len(self):
            return self
        return dataclasses.replace(self, x=self.x[:limit], y=self.y[:limit])

    @property
    def targets(self) -> int:
        """Predictions a pass over the set scores (tokens for a language model)."""
        return self.y.numel()


def _to_tensors(images: np.ndarray) -> torch.Tensor:
    x = torch.from_numpy(np.ascontiguousarray(images)).float()
    if x.ndim == 3:
        x = x.unsqueeze(1)
    return x


def _normalise(train_x: torch.Tensor, test_x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # statistics of the training split only, per channel, applied to both splits
    dims = (0, 2, 3)
    mean = train_x.mean(dim=dims, keepdim=True)
    std = train_x.std(dim=dims, keepdim=True).clamp_min(1e-6)
    return (train_x - mean) / std, (test_x - mean) / std


def _synthetic(seed: int, n_train: int = 4000, n_test: int = 1000) -> tuple:
    """Ten Gaussian classes in 1x16x16: learnable in seconds, deterministic for a seed."""
    g = np.random.default_rng(seed + 12345)
    centres = g.normal(0.0, 1.0, size=(10, 1, 16, 16)).astype(np.float32)

    def draw(n: int):
        labels = g.integers(0, 10, size=n)
        noise = g.normal(0.0, 3.0, size=(n, 1, 16, 16)).astype(np.float32)
        return centres[labels] + noise, labels.astype(np.int64)

    (a, b), (c, d) = draw(n_train), draw(n_test)
    return a, b, c, d


def _digits(seed: int) -> tuple:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DataError(
            "digits: scikit-learn is not installed (pip install scikit-learn)") from None
    bunch = load_digits()
    images = bunch.images.astype(np.float32)
    labels = bunch.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(labels))
    images, labels = images[order], labels[order]
    cut = int(0.8 * len(labels))
    return images[:cut], labels[:cut], images[cut:], labels[cut:]


def _idx(name: str, data_dir: str | None, seed: int, train_limit: int, test_limit: int):
    directory = data_dir or (FASHION_MNIST_DIR if name == "fashion-mnist" else None)
    if directory is None:
        raise DataError(f"--data {name}: needs --data-dir pointing at the IDX files")
    if not Path(directory).is_dir():
        hint = " (apt-get install dataset-fashion-mnist)" if name == "fashion-mnist" else ""
        raise DataError(f"--data-dir {directory}: no such directory{hint}")
    tx, ty = load_idx_split(directory, train=True, limit=train_limit)
    vx, vy = load_idx_split(directory, train=False, limit=test_limit)
    return tx, ty, vx, vy


def _cifar(name: str, data_dir: str | None, seed: int, train_limit: int, test_limit: int):
    if data_dir is None:
        raise DataError("--data cifar10: needs --data-dir pointing at the binary batches")
    tx, ty = load_cifar_split(data_dir, train=True)
    vx, vy = load_cifar_split(data_dir, train=False)
    return tx, ty, vx, vy


@dataclass(frozen=True)
class DataKind:
    """A data set ``--data`` offers: its loader ((name, data_dir, seed, train_limit,
    test_limit) -> train images, labels, test images, labels as numpy arrays), its
    training-set size (a study plans its evaluations without loading it) and its task.
    A set that is not images (``task`` lm, ctr) has ``build`` instead: (name, data_dir,
    seed, options) -> (train, test) :class:`Dataset`."""

    load: Callable[[str, str | None, int, int, int], tuple] | None
    train_size: int
    task: str = "classify"
    build: Callable[..., tuple[Dataset, Dataset]] | None = None


@dataclass(frozen=True)
class DataOptions:
    """What a non-image set is cut by: a language model's context and tokens."""

    context: int = 64
    tokens: str = "char"
    # a generated set (ctr-synthetic) draws only this many samples (0: its default)
    train_limit: int = 0
    test_limit: int = 0


def _text(name: str, data_dir: str | None, seed: int, opts: DataOptions):
    tx, ty, vx, vy, vocab, info = text_splits(name, data_dir, seed, opts.context, opts.tokens)
    classes = len(vocab) if vocab else 256
    return (Dataset(name, tx, ty, classes, task="lm", vocab=vocab, info=info),
            Dataset(name, vx, vy, classes, task="lm", vocab=vocab, info=info))


def _ctr(name: str, data_dir: str | None, seed: int, opts: DataOptions):
    tx, ty, vx, vy, info = click_log(seed, opts.train_limit or TRAIN_SAMPLES,
                                     opts.test_limit or TEST_SAMPLES)
    return (Dataset(name, tx, ty, 2, task="ctr", info=info),
            Dataset(name, vx, vy, 2, task="ctr", info=info))


# every data set --data offers: adding one is its loader and one line here
DATASETS: Catalog[DataKind] = Catalog("data set", "--data")
DATASETS.add("fashion-mnist", DataKind(_idx, 60000), "Fashion-MNIST (Debian's files)")
DATASETS.add("mnist", DataKind(_idx, 60000), "MNIST IDX files in --data-dir")
DATASETS.add("idx", DataKind(_idx, 60000), "any IDX (MNIST-format) files in --data-dir")
DATASETS.add("cifar10", DataKind(_cifar, 50000), "CIFAR-10 binary batches in --data-dir")
DATASETS.add("digits", DataKind(lambda n, d, seed, a, b: _digits(seed), 1437),
             "scikit-learn's 8x8 digits")
DATASETS.add("synthetic", DataKind(lambda n, d, seed, a, b: _synthetic(seed), 4000),
             "a seeded synthetic set (tests, smoke runs)")
DATASETS.add("shakespeare", DataKind(None, 47799, "lm", _text),
             "Tiny Shakespeare, 1.1M characters, for --model gpt (characters or --tokens byte)")
DATASETS.add("text", DataKind(None, 0, "lm", _text),
             "any UTF-8 text file or folder of .txt files in --data-dir, for --model gpt")
DATASETS.add("ctr-synthetic", DataKind(None, TRAIN_SAMPLES, "ctr", _ctr),
             "a SYNTHETIC Criteo-shaped click log (Zipf ids, hidden logistic teacher: best "
             "log-loss known), for --model ctr")


def load_data(
    name: str, data_dir: str | None = None, seed: int = 0, train_limit: int = 0,
    test_limit: int = 0, options: DataOptions | None = None,
) -> tuple[Dataset, Dataset]:
    """(train, test) for a data set name; ``data_dir`` points at IDX / CIFAR files.
    ``train_limit`` / ``test_limit`` > 0: IDX files are read only that far (a header's claim
    is then never allocated in full). ``options``: how a text set is cut into windows."""
    try:
        kind = DATASETS.get(name)
    except ConfigError as e:
        raise DataError(str(e)) from None
    if kind.build is not None:
        options = dataclasses.replace(options or DataOptions(), train_limit=train_limit,
                                      test_limit=test_limit)
        train, test = kind.build(name, data_dir, seed, options)
        for split, part in (("training", train), ("test", test)):
            if len(part) == 0:
                raise DataError(f"--data {name}: the {split} split is empty")
        return train, test
    tx, ty, vx, vy = kind.load(name, data_dir, seed, train_limit, test_limit)
    for split, labels in (("training", ty), ("test", vy)):
        if len(labels) == 0:
            raise DataError(f"--data {name}: the {split} split is empty")
    train_x, test_x = _normalise(_to_tensors(tx), _to_tensors(vx))
    if train_x.shape[1:] != test_x.shape[1:]:
        raise DataError(f"--data {name}: train images {tuple(train_x.shape[1:])} and test images "
                        f"{tuple(test_x.shape[1:])} differ in shape")
    seen = [int(labels.max()) for labels in (ty, vy) if len(labels)]  # an empty split: none
    num_classes = max(seen) + 1 if seen else 10
    num_classes = max(num_classes, 10) if name != "synthetic" else 10
    return (
        Dataset(name, train_x, torch.from_numpy(ty), num_classes),
        Dataset(name, test_x, torch.from_numpy(vy), num_classes),
    )
