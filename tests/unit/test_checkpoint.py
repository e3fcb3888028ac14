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


def _old_format_bytes(payload) -> bytes:
    """The layout as written before the streaming save: BytesIO body, then MAGIC + digest +
    body in one write."""
    import hashlib
    import io

    from phalanx.runtime.checkpoint import MAGIC

    buf = io.BytesIO()
    torch.save(payload, buf)
    body = buf.getvalue()
    return MAGIC + hashlib.sha256(body).digest() + body


def test_streaming_save_is_byte_compatible_both_ways(tmp_path):
    """The streamed file is byte for byte what the in-memory writer produced: a file
    written before this change loads now, and one written now loads with the old reader
    (the same magic, digest and body)."""
    import hashlib

    from phalanx.runtime.checkpoint import MAGIC

    payload = {"w": torch.randn(3, 300), "b": torch.arange(7), "step": 11, "name": "x"}
    old = _old_format_bytes(payload)
    new_path = tmp_path / "new.pt"
    save_checkpoint(new_path, payload)
    new = new_path.read_bytes()
    assert new == old
    # old file -> new loader
    old_path = tmp_path / "old.pt"
    old_path.write_bytes(old)
    got = load_checkpoint(old_path)
    assert torch.equal(got["w"], payload["w"]) and got["step"] == 11
    # new file -> the old reader's checks (header, digest of the body)
    assert new[:8] == MAGIC and hashlib.sha256(new[40:]).digest() == new[8:40]


def test_corrupt_body_byte_detected_after_streaming_save(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint(path, {"w": torch.randn(4096)})  # body well past one header
    blob = bytearray(path.read_bytes())
    blob[40 + (len(blob) - 40) // 2] ^= 0x01  # one bit in the middle of the body
    path.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_checkpoint(path)


def test_crash_mid_write_leaves_old_file_and_no_temp(tmp_path, monkeypatch):
    """A failure while the body is streamed leaves the previous checkpoint under the final
    name, untouched, and no temp file."""
    path = tmp_path / "c.pt"
    save_checkpoint(path, {"w": torch.zeros(10), "step": 1})
    before = path.read_bytes()

    def torn(obj, f, *a, **k):  # writes part of a body, then the process "dies"
        f.write(b"PK\x03\x04 partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", torn)
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint c.pt \(disk full\); "
                       "the previous one is kept whole"):
        save_checkpoint(path, {"w": torch.ones(10), "step": 2})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def test_save_holds_no_copy_of_the_payload(tmp_path):
    """Saving a 200 MB state dict raises the process's peak RSS by far less than one copy
    of it (measured: 2 MiB now; 382 MiB, two copies, with the BytesIO writer). Run in a
    fresh process so ru_maxrss is this save's."""
    import subprocess
    import sys

    script = (
        "import resource, sys, torch\n"
        "from phalanx.runtime.checkpoint import save_checkpoint\n"
        "sd = {f'w{i}': torch.ones(5_000_000) for i in range(10)}\n"  # 10 x 20 MB
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "save_checkpoint(sys.argv[1], sd)\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print((after - before) * 1024)\n")  # ru_maxrss is in KiB on Linux
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "big.pt")],
                         capture_output=True, text=True, check=True, timeout=120)
    rise = int(out.stdout.split()[-1])
    assert rise < 50 * 2**20, f"save raised peak RSS by {rise / 2**20:.0f} MiB"
    assert load_checkpoint(tmp_path / "big.pt")["w9"].sum().item() == 5_000_000


def test_a_killed_writer_s_temp_file_is_swept_by_the_next_save(tmp_path):
    """A writer SIGKILLed mid-write leaves ``.c.pt.tmpPID``; the next save of c.pt removes
    it (its PID is gone) and leaves a live writer's alone."""
    import os
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = tmp_path / "c.pt"
    (tmp_path / f".c.pt.tmp{dead.pid}").write_bytes(b"PHXCKPT1 half")
    (tmp_path / f".c.pt.tmp{os.getppid()}").write_bytes(b"a live writer's")
    (tmp_path / ".other.pt.tmp1").write_bytes(b"not this file's")
    save_checkpoint(path, {"step": 3})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f".c.pt.tmp{os.getppid()}", ".other.pt.tmp1", "c.pt"])
    assert load_checkpoint(path)["step"] == 3
