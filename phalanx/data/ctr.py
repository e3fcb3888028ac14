"""``--data ctr-synthetic``: a seeded, SYNTHETIC click log with a known best log-loss.

Not real data: a stand-in shaped like Criteo's (13 dense features, 26 categorical fields)
whose labels come from a hidden teacher, so how close a model gets to the best possible is
measurable.

- **Ids** are Zipf-distributed per field (rank ``k`` drawn with probability ~ 1 / k^s, as
  real click logs are: a few hot values and a long tail); each field has its own vocabulary
  size (log-uniform, 10 to 200,000 values) and its own seeded permutation of ranks to ids.
  Ids are raw (the field's vocabulary); the model hashes them into its table
  (``id % --ctr-rows``, :mod:`phalanx.models.ctr`), so the same data serves any table size.
- **Dense features**: standard normal.
- **Labels**: a hidden logistic teacher, ``p = sigmoid(b + sum_f w_f[id_f] + u . dense)``
  with a normal weight per id, ``click ~ Bernoulli(p)``. The teacher's expected log-loss on
  the test set, the mean binary entropy of its ``p``, is the Bayes-optimal log-loss
  (``best_logloss`` in the summary's ``data_*``); ``base_logloss`` is that of predicting
  the training click rate, what a model that learnt nothing scores.

Rows: dense features first, then the ids as exact float32 integers (all below 2**24).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from phalanx.metrics.ranking import auc

DENSE, FIELDS = 13, 26
TRAIN_SAMPLES, TEST_SAMPLES = 1_000_000, 50_000
ZIPF_S = 1.1  # the tail's exponent
VOCAB = (10, 200_000)  # per-field vocabulary sizes, log-uniform in this range
BIAS = -1.6  # a ~25-30% click rate (Criteo's is ~26%)
ID_SCALE = 1.5  # std of the ids' summed contribution to the logit
DENSE_SCALE = 0.7  # std of the dense features' contribution


def _entropy(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return -(p * np.log(p) + (1 - p) * np.log1p(-p))


def _vocab(g: np.random.Generator, fields: int) -> np.ndarray:
    return np.exp(g.uniform(math.log(VOCAB[0]), math.log(VOCAB[1]), fields)).astype(np.int64)


def vocab_sizes(seed: int, fields: int = FIELDS) -> tuple[int, ...]:
    """Each field's vocabulary size in ``click_log(seed)`` (its generator's first draw),
    without making the log: what a model of the table's traffic needs."""
    return tuple(int(v) for v in _vocab(np.random.default_rng(seed + 31337), fields))


def click_log(seed: int, train: int = TRAIN_SAMPLES, test: int = TEST_SAMPLES,
              dense: int = DENSE, fields: int = FIELDS):
    """(train x, train y, test x, test y, info): see the module doc."""
    g = np.random.default_rng(seed + 31337)
    n = train + test
    vocab = _vocab(g, fields)
    ids = np.empty((n, fields), dtype=np.int64)
    logit = np.full(n, BIAS)
    for f in range(fields):
        v = int(vocab[f])
        cdf = np.cumsum(1.0 / np.arange(1, v + 1) ** ZIPF_S)
        rank = np.searchsorted(cdf, g.random(n) * cdf[-1]).clip(max=v - 1)
        ids[:, f] = g.permutation(v)[rank]  # hot ranks land on scattered ids
        weights = g.normal(0.0, ID_SCALE / math.sqrt(fields), v)
        logit += weights[ids[:, f]]
    x_dense = g.standard_normal((n, dense))
    logit += x_dense @ g.normal(0.0, DENSE_SCALE / math.sqrt(dense), dense)
    p = 1.0 / (1.0 + np.exp(-logit))
    y = (g.random(n) < p).astype(np.int64)
    x = np.concatenate([x_dense, ids.astype(np.float64)], axis=1).astype(np.float32)
    rate = float(y[:train].mean())
    info = {
        "synthetic": True,
        "kind": "synthetic click log (Zipf ids, hidden logistic teacher)",
        "dense_features": dense, "fields": fields,
        "vocab_sizes": vocab.tolist(),
        "click_rate": rate,
        "best_logloss": float(_entropy(p[train:]).mean()),  # the teacher's, expected
        "base_logloss": float(_entropy(np.array([rate]))[0]),
    }
    tx, vx = torch.from_numpy(x[:train]), torch.from_numpy(x[train:])
    ty, vy = torch.from_numpy(y[:train]), torch.from_numpy(y[train:])
    info["best_auc"] = auc(torch.from_numpy(p[train:]), vy)
    return tx, ty, vx, vy, info
