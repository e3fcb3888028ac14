import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.data import epoch_batches, parse_augment, shard_indices
from phalanx.data.augment import flip, noise, rotate, translate
from phalanx.errors import ConfigError


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 500), world=st.integers(1, 8), seed=st.integers(0, 5),
       non_iid=st.sampled_from([0.0, 0.3, 1.0]))
def test_shards_are_disjoint_and_cover(n, world, seed, non_iid):
    labels = torch.randint(0, 10, (n,), generator=torch.Generator().manual_seed(seed))
    shards = [shard_indices(labels, r, world, seed, non_iid) for r in range(world)]
    joined = torch.cat(shards)
    assert len(joined) == n and len(joined.unique()) == n
    assert max(map(len, shards)) - min(map(len, shards)) <= 2
    again = shard_indices(labels, 0, world, seed, non_iid)
    assert torch.equal(again, shards[0])


def test_non_iid_skews_labels():
    labels = torch.arange(1000) % 10
    iid = [labels[shard_indices(labels, r, 5, 0, 0.0)].unique().numel() for r in range(5)]
    skew = [labels[shard_indices(labels, r, 5, 0, 1.0)].unique().numel() for r in range(5)]
    assert min(iid) == 10 and max(skew) <= 3


def test_epoch_batches_drop_partial_and_reshuffle():
    idx = torch.arange(103)
    b0 = list(epoch_batches(idx, 10, epoch=0))
    b1 = list(epoch_batches(idx, 10, epoch=1))
    assert len(b0) == 10 and all(len(b) == 10 for b in b0)
    assert not torch.equal(torch.cat(b0), torch.cat(b1))
    assert len(torch.cat(b0).unique()) == 100


def test_augmentations_shapes_and_effects():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 1, 12, 12)
    assert torch.equal(flip(p=1.0)(x, g), x.flip(-1))
    assert torch.equal(flip(p=0.0)(x, g), x)
    t = translate(2)(x, g)
    assert t.shape == x.shape and not torch.equal(t, x)
    r = rotate(0.0)(x, g)
    assert torch.allclose(r, x, atol=1e-5)  # zero-degree rotation is the identity
    assert noise(0.0)(x, g).equal(x)
    composed = parse_augment("flip, translate,rotate,noise")
    assert composed(x, g).shape == x.shape
    assert parse_augment("") is None


def test_translate_moves_content():
    g = torch.Generator().manual_seed(1)
    x = torch.zeros(1, 1, 9, 9)
    x[0, 0, 4, 4] = 1.0
    y = translate(2)(x, g)
    assert y.sum() == 1.0  # a single pixel moves, it is not lost (shift <= padding)


def test_unknown_augmentation():
    with pytest.raises(ConfigError, match="--augment: 'blur'"):
        parse_augment("flip,blur")
