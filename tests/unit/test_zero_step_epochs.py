"""A batch larger than the data (or a worker's shard), or an empty split, is refused in
one line before anything runs, for every strategy; and no loop can spin over empty epochs
(issue 18, cause 1: the run looped forever, writing an eval event per empty epoch)."""

import time

import pytest
import torch

from phalanx.data import Dataset, epoch_batches
from phalanx.entry import api
from phalanx.errors import ConfigError, DataError
from phalanx.parallel.registry import NAMES as STRATEGIES

EXTRA = {"pipeline": {"stages": 2, "microbatches": 1}, "hybrid": {"stages": 2},
         "model-parallel": {"workers": 2}}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_batch_larger_than_the_data_is_refused_for_every_strategy(tmp_path, strategy):
    workers = 1 if strategy in ("single", "pipeline", "hybrid") else 2
    options = {"workers": workers, **EXTRA.get(strategy, {})}
    t0 = time.perf_counter()
    # sandblaster's objective is the whole set: it refuses --batch-size as a setting it
    # does not use (as `phalanx train` does), before the size is compared
    expected = ("--batch-size: --strategy sandblaster does not use it" if strategy == "sandblaster"
                else "--batch-size: 5000 is larger than")
    with pytest.raises(ConfigError, match=expected):
        api.train("mlp", "synthetic", strategy=strategy, batch_size=5000, max_steps=20,
                  progress=False, tensorboard=False, out=str(tmp_path / "run"), **options)
    assert time.perf_counter() - t0 < 20  # refused in the driver: no process was started
    assert not (tmp_path / "run" / "events.jsonl").exists()


def test_default_batch_with_a_tiny_train_limit_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="larger than the training set \\(10 samples\\)"):
        api.train("mlp", "synthetic", train_limit=10, progress=False, tensorboard=False,
                  out=str(tmp_path / "run"))


def test_asp_shard_smaller_than_a_batch_names_the_workers(tmp_path):
    with pytest.raises(ConfigError, match="--workers 4"):
        api.train("mlp", "synthetic", strategy="asp", workers=4, train_limit=200,
                  batch_size=64, progress=False, tensorboard=False, out=str(tmp_path / "r"))


def _set(n: int) -> Dataset:
    return Dataset("t", torch.zeros(n, 1, 4, 4), torch.zeros(n, dtype=torch.int64), 10)


@pytest.mark.parametrize("train_n,test_n,match", [(0, 8, "training split is empty"),
                                                  (64, 0, "test split is empty")])
def test_empty_split_is_refused(tmp_path, train_n, test_n, match):
    with pytest.raises(DataError, match=match):
        api.train("mlp", (_set(train_n), _set(test_n)), progress=False, tensorboard=False,
                  batch_size=8, out=str(tmp_path / "r"))


def test_epoch_batches_refuses_a_shard_smaller_than_a_batch():
    with pytest.raises(DataError, match="larger than this worker's 3 samples"):
        next(epoch_batches(torch.arange(3), 4, epoch=0))
    assert len(list(epoch_batches(torch.arange(8), 4, epoch=0))) == 2
