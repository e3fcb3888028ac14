import pytest
import torch

from phalanx.runtime.checkpoint import CheckpointError, load_checkpoint, save_checkpoint


def test_round_trip(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint(path, {"w": torch.arange(5.0), "step": 7, "name": "x"})
    got = load_checkpoint(path)
    assert torch.equal(got["w"], torch.arange(5.0)) and got["step"] == 7
    assert not list(tmp_path.glob(".*tmp*"))  # no temp file left behind


def test_truncated_and_corrupt_refused(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint(path, {"w": torch.randn(100)})
    blob = path.read_bytes()
    path.write_bytes(blob[:-10])
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_checkpoint(path)
    flipped = bytearray(blob)
    flipped[-5] ^= 0xFF
    path.write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_checkpoint(path)
    path.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="bad header"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "missing.pt")


class _Evil:
    """Stands for any non-tensor object a hostile file could carry."""


def test_pickled_objects_are_refused(tmp_path):
    """A checksummed file that holds arbitrary Python objects still does not load: the
    payload is read with weights_only=True."""
    import hashlib
    import io

    from phalanx.runtime.checkpoint import MAGIC

    buf = io.BytesIO()
    torch.save({"x": _Evil()}, buf)
    body = buf.getvalue()
    path = tmp_path / "evil.pt"
    path.write_bytes(MAGIC + hashlib.sha256(body).digest() + body)
    with pytest.raises(CheckpointError, match="unreadable checkpoint payload"):
        load_checkpoint(path)
