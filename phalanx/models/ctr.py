"""A click-through-rate model of the Wide&Deep / DLRM family (``--model ctr``).

Input: one row of a click log, ``x`` (B, D + F) float32 — D dense features first, then F
categorical ids (exact integers in float32, below 2**24; :mod:`phalanx.data.ctr`).

- **Hashed embeddings.** Field ``f`` has ``rows`` embedding rows of ``dim`` values; a raw id
  goes to row ``id % rows`` of its field (the hashing trick: the data's vocabularies may be
  larger than the table, and colliding ids share a row). All fields live in one
  ``nn.EmbeddingBag`` of ``F x rows`` rows (field ``f`` at offset ``f x rows``), with
  ``sparse=True``: a step's gradient holds only the rows the batch touched. Being the first
  layer of an ``nn.Sequential``, the table is what the parameter server deals out row by
  row (:mod:`phalanx.ps.partition`).
- **Deep and wide.** The D dense features and the F embeddings are concatenated; an MLP
  (the deep part) and one linear layer (the wide part: a logistic regression on the same
  features, which can express a per-id weight through the embedding) each give a logit,
  and their sum ``z`` is the click logit.
- **Output contract.** The model returns (B, 2) logits ``[0, z]``: their softmax is
  ``(1 - sigmoid(z), sigmoid(z))``, so the cross-entropy every strategy trains with
  (:mod:`phalanx.models.loss`) is exactly the log-loss of ``p = sigmoid(z)``, and argmax is
  the click prediction at p > 0.5. No strategy branches on the task.

With the defaults (26 fields like Criteo, 65,536 rows, 16 values) the table holds 27.3M
parameters and the MLP ~30k: a step touches a few thousand rows of the table, which is why
moving only those rows (the parameter server, ``--sparse-allreduce``) pays.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from phalanx.errors import ConfigError

ROWS, DIM = 65536, 16  # per field; --ctr-rows, --ctr-dim
HIDDEN = (64, 32)
MAX_ID = 2**24  # ids are carried in float32: exact below this


class HashedFields(nn.EmbeddingBag):
    """F fields' hashed tables as one sparse ``nn.EmbeddingBag`` of F x ``rows`` rows.
    ``forward`` takes a click-log row (dense features, then ids) and returns the dense
    features beside the F embeddings, (B, D + F x dim)."""

    def __init__(self, dense: int, fields: int, rows: int, dim: int) -> None:
        super().__init__(fields * rows, dim, mode="sum", sparse=True)
        self.dense, self.fields, self.field_rows = dense, fields, rows
        self.register_buffer("offsets_", torch.arange(fields, dtype=torch.int64) * rows,
                             persistent=False)
        nn.init.normal_(self.weight, 0.0, 0.01)  # small: a fresh model predicts the base rate

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """The table rows a batch reads, (B, F) int64: field offset + id mod rows, computed
        on ``x``'s device, whatever the table's: a parameter-server worker on a GPU asks
        for the rows of the test set, which stays on the host (the first GPU check failed
        there: cuda:0 and cpu). The offsets are F integers; ``x`` may be the whole test
        set, so it is not the one moved."""
        ids = x[:, self.dense :].to(torch.int64)
        return ids.remainder(self.field_rows) + self.offsets_.to(ids.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        rows = self.rows(x)
        # one bag per (sample, field): a plain lookup, with EmbeddingBag's sparse gradient
        emb = super().forward(rows.reshape(-1, 1)).view(len(x), -1)
        return torch.cat([x[:, : self.dense], emb], dim=1)


class WideDeep(nn.Module):
    """The click logit of the concatenated features: MLP + linear, as (B, 2) logits
    ``[0, z]`` (see the module doc)."""

    def __init__(self, features: int, hidden: tuple[int, ...] = HIDDEN) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.deep = nn.Sequential(*layers)
        self.wide = nn.Linear(features, 1)
        for m in self.deep:
            if isinstance(m, nn.Linear):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)
        nn.init.zeros_(self.wide.weight)
        nn.init.zeros_(self.wide.bias)
        last = self.deep[-1]
        nn.init.normal_(last.weight, 0.0, 0.01)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        z = self.deep(h) + self.wide(h)
        return torch.cat([torch.zeros_like(z), z], dim=1)


def ctr(input_shape: tuple[int, ...], num_classes: int, *, dense: int, rows: int = ROWS,
        dim: int = DIM) -> nn.Sequential:
    """The click model for rows of ``input_shape`` = (D + F,) with ``dense`` = D."""
    if len(input_shape) != 1 or input_shape[0] <= dense:
        raise ConfigError(f"--model ctr: takes click-log rows (D dense + F ids), got input "
                          f"{tuple(input_shape)} with {dense} dense features")
    if num_classes != 2:
        raise ConfigError(f"--model ctr: predicts clicks (2 classes), the data has {num_classes}")
    fields = input_shape[0] - dense
    if fields * rows >= 2**31:
        raise ConfigError(f"--ctr-rows: {fields} fields x {rows} rows is past 2**31 rows")
    return nn.Sequential(OrderedDict([
        ("embed", HashedFields(dense, fields, rows, dim)),
        ("head", WideDeep(dense + fields * dim)),
    ]))


def table_rows(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The sorted, unique table rows a batch ``x`` reads, for a model whose first layer is
    the table (:class:`HashedFields`, or a plain embedding indexed by ``x`` itself), on
    ``x``'s device (not necessarily the model's)."""
    first = next(iter(model.children()))
    return (first.rows(x) if isinstance(first, HashedFields) else x).unique()
