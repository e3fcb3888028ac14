"""Finding a model's blocks at any depth (``parallel/blocks.py``, issue 47): the largest
list of same-class modules, a ModuleList or an nn.Sequential, or the one ``--split-at``
names; a model cut there as pre, blocks, post computes what its own forward computes."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from phalanx.errors import ConfigError
from phalanx.parallel.blocks import BlockView, find_blocks, name_blocks
from phalanx.parallel.partition import layers_of


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        # a list of mixed classes inside every block: never the block list
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.ln(x))


class Inner(nn.Module):
    """minGPT-like, one level down: ``gpt.blocks`` is an nn.Sequential of blocks, and a
    smaller ModuleList of same-class adapters sits beside it."""

    def __init__(self, dim: int = 8, vocab: int = 11) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(*(Block(dim) for _ in range(3)))
        self.adapters = nn.ModuleList(nn.Linear(dim, dim) for _ in range(2))
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor):
        x = self.tok(idx)
        x = self.blocks(x)
        for a in self.adapters:
            x = x + a(x)
        return self.head(x), None  # nanoGPT's (logits, loss)


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gpt = Inner()

    def forward(self, idx: torch.Tensor):
        return self.gpt(idx)


def test_the_largest_list_of_same_class_modules_at_any_depth():
    model = Outer()
    name, blocks = find_blocks(model)
    assert name == "gpt.blocks" and isinstance(blocks, nn.Sequential) and len(blocks) == 3


def test_split_at_names_another_list_and_copies_keep_it():
    model = Outer()
    name_blocks(model, "gpt.adapters")
    assert find_blocks(model)[0] == "gpt.adapters"
    assert find_blocks(copy.deepcopy(model))[0] == "gpt.adapters"


@pytest.mark.parametrize(("name", "says"), [
    ("gpt.nope", "has no module of that name (its lists of blocks: gpt.blocks, gpt.adapters"),
    ("gpt.head", "a Linear, not a ModuleList or nn.Sequential of blocks"),
])
def test_a_bad_split_at_is_one_line(name, says):
    with pytest.raises(ConfigError) as e:
        name_blocks(Outer(), name)
    assert str(e.value).startswith(f"--split-at {name}: ") and says in str(e.value)
    assert "\n" not in str(e.value)


def test_cut_at_nested_blocks_the_layers_compute_the_models_forward():
    torch.manual_seed(0)
    model = Outer()
    idx = torch.randint(0, 11, (2, 5))
    want = model(idx)[0]
    layers = layers_of(model)
    assert [n for n, _ in layers] == ["pre", "block0", "block1", "block2", "post"]
    x = idx
    for _, layer in layers:
        x = layer(x)
    assert torch.equal(x, want)  # post hands on the logits of the tuple
    view = BlockView(model)
    state = list(model.state_dict())
    assert view.keys(state, "block1") == [k for k in state if k.startswith("gpt.blocks.1.")]
    assert set(view.keys(state, "post")) == {k for k in state if k.startswith(
        ("gpt.adapters.", "gpt.head."))}


def test_split_at_inside_a_sequential_model_cuts_at_its_blocks():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(11, 8), nn.Sequential(Block(8), Block(8)),
                          nn.Linear(8, 11))
    assert [n for n, _ in layers_of(model)] == ["0", "1", "2"]  # its children, by default
    name_blocks(model, "1")
    layers = layers_of(model)
    assert [n for n, _ in layers] == ["pre", "block0", "block1", "post"]
    idx = torch.randint(0, 11, (2, 5))
    x = idx
    for _, layer in layers:
        x = layer(x)
    assert torch.equal(x, model(idx))
