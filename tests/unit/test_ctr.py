"""The click-through workload's pieces: the synthetic click log, the exact AUC, the click
model's output contract, the lazy row update, single learning, and the one-line refusals."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import phalanx
from phalanx.config import RunConfig
from phalanx.data import load_data
from phalanx.data.ctr import click_log
from phalanx.errors import ConfigError
from phalanx.metrics.ranking import auc
from phalanx.models import build_model
from phalanx.models.ctr import table_rows
from phalanx.parallel.registry import check_config
from phalanx.rules import adagrad, apply_updates, sgd
from phalanx.rules.sparse import TableRule

SMALL = {"ctr_rows": 1000, "ctr_dim": 8}


def small_data(seed: int = 0):
    return load_data("ctr-synthetic", seed=seed, train_limit=4000, test_limit=1000)


def test_click_log_is_seeded_skewed_and_has_a_known_best():
    a, b = click_log(3, 3000, 500), click_log(3, 3000, 500)
    assert all(torch.equal(x, y) for x, y in zip(a[:4], b[:4]))
    assert not torch.equal(a[0], click_log(4, 3000, 500)[0])
    tx, ty, vx, vy, info = a
    assert tx.dtype == torch.float32 and tx.shape == (3000, 13 + 26) and ty.dtype == torch.int64
    ids = tx[:, 13:]
    assert torch.equal(ids, ids.round()) and ids.max() < 2**24 and ids.min() >= 0
    assert set(ty.unique().tolist()) <= {0, 1}
    # Zipf: in a field with a large vocabulary, the top id alone is far above uniform
    big = int(np.argmax(info["vocab_sizes"]))
    counts = torch.bincount(ids[:, big].long())
    assert counts.max() > 50 * len(ids) / info["vocab_sizes"][big]
    assert info["synthetic"] is True
    assert info["best_logloss"] < info["base_logloss"] - 0.05
    assert 0.5 < info["best_auc"] < 1.0


def brute_auc(s: list[float], y: list[int]) -> float:
    pairs = [(a, b) for (a, ya), (b, yb) in itertools.product(zip(s, y), repeat=2)
             if ya == 1 and yb == 0]
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs) / len(pairs)


def test_auc_matches_the_pair_count_ties_included():
    g = torch.Generator().manual_seed(0)
    for n in (2, 7, 40, 200):
        s = torch.randint(0, 5, (n,), generator=g).float()  # many ties
        y = torch.randint(0, 2, (n,), generator=g)
        y[0], y[1] = 0, 1
        assert auc(s, y) == pytest.approx(brute_auc(s.tolist(), y.tolist()), abs=1e-12)
    assert auc(torch.tensor([0.1, 0.9]), torch.tensor([0, 1])) == 1.0
    assert math.isnan(auc(torch.tensor([0.1, 0.9]), torch.tensor([1, 1])))


def test_the_model_returns_zero_and_the_click_logit_so_cross_entropy_is_log_loss():
    train, _ = small_data()
    model = build_model("ctr", train.input_shape, 2, dense=13, rows=1000, dim=8)
    out = model(train.x[:50])
    assert out.shape == (50, 2) and torch.equal(out[:, 0], torch.zeros(50))
    z, y = out[:, 1], train.y[:50]
    log_loss = F.binary_cross_entropy_with_logits(z, y.float())
    assert F.cross_entropy(out, y).item() == pytest.approx(log_loss.item(), rel=1e-6)
    # the table is the first layer, sparse, and a batch reads only its rows
    F.cross_entropy(out, y).backward()
    grad = model[0].weight.grad
    assert grad.is_sparse
    assert torch.equal(grad.coalesce().indices()[0], table_rows(model, train.x[:50]))
    # ids are hashed into each field's rows: an id and id + rows share a row
    x = train.x[:1].clone()
    x2 = x.clone()
    x2[0, 13] += 1000
    assert torch.equal(model[0].rows(x), model[0].rows(x2))


def test_rows_are_computed_on_the_inputs_device_not_the_tables():
    """A parameter-server worker on a GPU asks for the rows of the host's test set
    (table_rows(model on cuda:0, x on the CPU)): the rows must not need x on the model's
    device (the first GPU check failed there, cuda:0 and cpu). Here the table is on the
    CPU and ``meta`` stands in for the other device: the rows come out on x's device, with
    the values they have on the CPU."""
    train, _ = small_data()
    model = build_model("ctr", train.input_shape, 2, dense=13, rows=1000, dim=8)
    x = train.x[:50]
    on_cpu = model[0].rows(x)
    assert on_cpu.shape == (50, 26) and on_cpu.dtype == torch.int64
    # field f's rows are f x 1000 + id mod 1000
    assert torch.equal(on_cpu, x[:, 13:].long() % 1000 + torch.arange(26) * 1000)
    elsewhere = model[0].rows(x.to("meta"))
    assert elsewhere.device.type == "meta" and elsewhere.shape == on_cpu.shape
    assert elsewhere.dtype == torch.int64
    assert torch.equal(table_rows(model, x), on_cpu.unique())


@pytest.mark.parametrize("rule", [sgd(0.1), adagrad(0.05)])
def test_touched_rows_only_equals_the_dense_update(rule):
    """For SGD and AdaGrad a row with no gradient does not move: updating the touched rows
    is the dense update."""
    train, _ = small_data()
    torch.manual_seed(0)
    model = build_model("ctr", train.input_shape, 2, dense=13, rows=1000, dim=8)
    dense_w = [p.detach().clone() for p in model.parameters()]
    sparse_w = [p.detach() for p in model.parameters()]
    table = TableRule(rule, 0)
    s_state, d_state = table.init(sparse_w), rule.init(dense_w)
    for k in range(3):
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(train.x[k * 64 : (k + 1) * 64]),
                        train.y[k * 64 : (k + 1) * 64]).backward()
        grads = [p.grad for p in model.parameters()]
        updates, d_state = rule.update([g.to_dense() for g in grads], d_state, dense_w)
        apply_updates(dense_w, updates)
        s_state = table.step(grads, s_state, sparse_w)
        for a, b in zip(dense_w, sparse_w):
            assert torch.allclose(a, b, atol=1e-6, rtol=0)
        with torch.no_grad():
            for p, w in zip(model.parameters(), dense_w):
                p.copy_(w)


def test_single_learns_well_below_the_base_rate(tmp_path):
    r = phalanx.train("ctr", "ctr-synthetic", strategy="single", train_limit=8000,
                      test_limit=1500, batch_size=64, progress=False,
                      tensorboard=False, out=str(tmp_path / "single"), **SMALL)
    s = r.summary
    assert s["data_synthetic"] is True and s["data_best_logloss"] < s["data_base_logloss"]
    assert s["test_loss"] < s["data_base_logloss"] - 0.03, s
    assert s["test_auc"] > 0.65
    evals = [e for e in r.events if e.get("kind") == "eval"]
    assert evals and all("test_auc" in e for e in evals)


@pytest.mark.parametrize("strategy", ["hogwild", "pipeline", "model-parallel", "hybrid",
                                      "sandblaster"])
def test_strategies_without_sparse_gradients_refuse_in_one_line(strategy):
    cfg = RunConfig.from_mapping({"model": "ctr", "data": "ctr-synthetic",
                                  "strategy": strategy, "workers": 2})
    with pytest.raises(ConfigError) as e:
        check_config(cfg)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("--model ctr:") and strategy in msg
    assert "sparse" in msg
