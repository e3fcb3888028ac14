"""A checkpoint file larger than memory could hold is refused before it is read (a sparse
file of any size costs an attacker nothing)."""

import pytest

from phalanx.limits import memory_bytes
from phalanx.runtime.checkpoint import CheckpointError, load_checkpoint


def test_huge_sparse_checkpoint_is_refused_without_reading(tmp_path):
    path = tmp_path / "ps_shard0.ckpt"
    with open(path, "wb") as f:
        f.truncate(memory_bytes())  # sparse: no disk used
    with pytest.raises(CheckpointError, match="more than half of this machine's memory"):
        load_checkpoint(path)
