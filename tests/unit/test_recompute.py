"""Activation checkpointing (``--activation-checkpoint K``, parallel/recompute.py): the
same gradients bit for bit (dropout included: the recomputation draws the same numbers),
fewer saved activations, the blocks found in phalanx's GPT and a nanoGPT-style model, and
one line for a model without blocks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from phalanx.errors import ConfigError
from phalanx.models.gpt import gpt
from phalanx.parallel.recompute import blocks_of, checkpoint_blocks


def _model(every: int) -> nn.Module:
    torch.manual_seed(0)
    m = gpt((32,), 65, layers=4, heads=2, dim=32, dropout=0.1)
    if every:
        checkpoint_blocks(m, every)
    return m


def _step(m: nn.Module) -> tuple[list[torch.Tensor], int]:
    """Gradients of one training step, and the bytes autograd saved for backward."""
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    x = torch.randint(0, 65, (8, 32), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(2)  # dropout's draws
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = nn.functional.cross_entropy(m(x).reshape(-1, 65), x.reshape(-1))
    loss.backward()
    return [p.grad.clone() for p in m.parameters()], saved


def test_same_gradients_fewer_saved_activations():
    plain, every, second = _model(0), _model(1), _model(2)
    g0, s0 = _step(plain)
    g1, s1 = _step(every)
    g2, s2 = _step(second)
    for a, b, c in zip(g0, g1, g2):
        assert torch.equal(a, b) and torch.equal(a, c)
    # each wrapped block saves its input only (measured: every block 0.10 of the bytes,
    # every second one 0.55)
    assert s1 < s2 < s0 and s1 < 0.5 * s0, (s0, s1, s2)
    assert len(blocks_of(every)) == 4 and {type(b).__name__ for b in blocks_of(every)} == {
        "Block"}
    assert list(plain.state_dict()) == list(every.state_dict())  # names unchanged


def test_a_model_without_blocks_is_one_line():
    with pytest.raises(ConfigError, match="--activation-checkpoint: --model mlp has no blocks"):
        checkpoint_blocks(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), 1,
                          "--model mlp")
