"""The shared-memory transport (``--transport shm``, phalanx/comm/shm.py):

* frames round-trip bit for bit through real rings in ``/dev/shm`` (every dtype, the wrap
  at the ring's end, a full ring's queue, a payload too large for the ring);
* a corrupted slot, a frame length that lies and a payload that is not what the header
  announced are each a :class:`WireError`, and the next message still arrives;
* over real processes a shard rejects and counts a corrupted header, a NaN push, a push
  of the wrong length and one of the wrong dtype exactly as over gloo: the same counters
  and the same weights, bit for bit;
* ASP with one worker over shm equals gloo and the single-worker loop bit for bit, and a
  run that ends normally leaves nothing in ``/dev/shm`` (SIGTERM and ``kill -9`` of the
  driver: tests/distributed/test_signals.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from phalanx.comm.shm import _META, SHM_PREFIX, SHM_ROOT, ShmTransport
from phalanx.comm.transport import HEADER_TAG, GlooTransport, PeerLost
from phalanx.comm.wire import HEADER_BYTES, MAGIC, Header, Kind, WireError
from phalanx.config import RunConfig
from phalanx.entry.api import make_job, train
from phalanx.parallel import ps
from phalanx.parallel.base import Job, read_result
from phalanx.parallel.ps_worker import WorkerStats
from phalanx.ps.client import PSClient
from phalanx.ps.partition import partition
from phalanx.ps.server import Layout
from phalanx.runtime.launch import spawn
from phalanx.runtime.signals import make_run_tempdir


@pytest.fixture
def shm_dir():
    path = make_run_tempdir(SHM_PREFIX, SHM_ROOT)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def pair(path: str, ring_bytes: int = 1 << 16) -> tuple[ShmTransport, ShmTransport]:
    return ShmTransport(0, 2, path, ring_bytes), ShmTransport(1, 2, path, ring_bytes)


def test_frames_round_trip_bit_for_bit(shm_dir):
    server, worker = pair(shm_dir)
    payloads = [torch.randn(7), torch.randn(5, dtype=torch.float64),
                torch.randn(3).half(), torch.randn(3).bfloat16(),
                torch.arange(-4, 5), torch.arange(3, dtype=torch.int32),
                torch.tensor([-3, 0, 7], dtype=torch.int8)]
    # 40 frames of ~10 KiB through a 64 KiB ring: it wraps, fills, and the queue drains it
    sent = []
    for i in range(40):
        tensors = [payloads[i % len(payloads)], torch.full((2500,), float(i))]
        worker.send(0, Header(Kind.PUSH, worker=0, clock=i, seq=i), tensors)
        sent.append(tensors)
    big = torch.randn(50_000)  # 200 kB: more than the ring holds, it spills to a file
    worker.send(0, Header(Kind.PUSH, worker=0, clock=40, seq=40), [big])
    for i, tensors in enumerate(sent):
        msg = server.recv(timeout_s=10)
        assert msg.src == 1 and msg.header.clock == i
        assert all(a.dtype == b.dtype and torch.equal(a, b)
                   for a, b in zip(msg.tensors, tensors))
    assert torch.equal(server.recv(timeout_s=10).tensors[0], big)
    worker.flush()
    assert not list(Path(shm_dir).glob("x-*"))  # the spilled payload's file is gone
    # bytes counted as the socket path counts them: header + payload
    assert server.counter.received == worker.counter.sent
    assert worker.counter.sent == 41 * HEADER_BYTES + sum(
        t.numel() * t.element_size() for ts in [*sent, [big]] for t in ts)
    # the control channel is its own: a FINAL is not a worker message
    server.send(1, Header(Kind.FINAL, shard=0), [torch.ones(3)])
    with pytest.raises(TimeoutError):
        worker.recv(timeout_s=0.05)
    assert worker.recv(timeout_s=5, control=True).header.kind == Kind.FINAL


def test_malformed_frames_are_rejected_and_the_next_message_arrives(shm_dir):
    server, worker = pair(shm_dir)
    good = Header(Kind.PUSH, worker=0, clock=1, seq=1)
    assert (Path(shm_dir) / "d-1-0").exists()  # made by its receiver; its sender ...

    def corrupt_next_frame(word: int, value: int, in_frame: bool = True) -> None:
        """Write a frame, then overwrite one of its int64 words in the ring (or, not
        ``in_frame``, the ring's own word ``word``: 8 is the tail)."""
        worker.send(0, good, [torch.ones(4)])
        mm = worker._out[(0, False)].mm  # the ring's file is gone: write through its map
        words = memoryview(mm).cast("q")
        head = words[0] % (len(mm) - _META)
        words[(_META + head) // 8 + word if in_frame else word] = value
        del words

    cases = [
        (lambda: corrupt_next_frame(2, 0x1234), "bad magic"),  # a corrupted slot
        (lambda: corrupt_next_frame(3, 99), "unknown message kind"),
        (lambda: corrupt_next_frame(0, 3), "bad length"),  # frame length out of range
        (lambda: corrupt_next_frame(0, 1 << 40), "bad length"),
        (lambda: corrupt_next_frame(8, 1 << 40, in_frame=False), "corrupt"),  # the tail
        # a length in range but not the header's: a payload that is not what it announced
        (lambda: worker.send_raw(0, Header(Kind.PUSH, worker=0, payload=((1, 4),)).encode(),
                                 [torch.ones(4)], frame_len=16 + 96),
         "payload does not match"),
        (lambda: worker.send_raw(
            0, Header(Kind.PUSH, worker=0, payload=((1, 10),)).encode(), [torch.ones(12)]),
         "payload does not match"),
    ]
    for make_bad, why in cases:
        make_bad()
        with pytest.raises(WireError, match=why):
            server.recv(timeout_s=5)
        worker.send(0, Header(Kind.PULL, worker=0, clock=2), [torch.arange(3)])
        msg = server.recv(timeout_s=5)  # the ring goes on
        assert msg.header.kind == Kind.PULL and torch.equal(msg.tensors[0], torch.arange(3))
    with pytest.raises(TimeoutError):
        server.recv(timeout_s=0.05)  # nothing else was left over
    assert not (Path(shm_dir) / "d-1-0").exists()  # ... mapped it second and unlinked it


def test_a_dead_peer_ends_a_receive_from_it_but_not_one_from_any_source(shm_dir):
    server = ShmTransport(0, 3, shm_dir)
    dead = subprocess.Popen(["true"])  # a pid that is gone
    dead.wait()
    (Path(shm_dir) / "pid-1").write_text(str(dead.pid))
    worker = ShmTransport(2, 3, shm_dir)
    worker.send(0, Header(Kind.DONE, worker=1))
    # from any source: the dead rank 1 is no error (as over gloo); rank 2's message comes
    assert server.recv(timeout_s=5).src == 2
    with pytest.raises(TimeoutError):
        server.recv(timeout_s=0.6)
    with pytest.raises(PeerLost) as lost:  # from rank 1 itself: its death ends the wait
        server.recv(src=1, timeout_s=30)
    assert lost.value.rank == 1


def _rogue(rank: int, world: int, job: Job, shm: str | None) -> None:
    """Server 0 runs for real; worker 0 sends a corrupted header, a NaN push, a push of
    the wrong length and one of the wrong dtype, then one good push."""
    if rank == 0:
        ps.process_main(rank, world, job, shm)
        return
    transport = ShmTransport(rank, world, shm) if shm else GlooTransport(rank, world)
    part = partition(job.build_model(), 1)
    client = PSClient(transport, part, Layout(1, 1), 0, 30.0)
    flat = torch.zeros(part.dense_numel)
    client.pull(0, flat)
    before = flat.clone()
    wire = Header(Kind.PUSH, worker=0, clock=0, seq=0).encode()
    wire[0] = MAGIC ^ 0xFF  # a corrupted slot / a corrupted socket message
    if shm:
        transport.send_raw(0, wire)
    else:
        dist.isend(wire, 0, tag=HEADER_TAG).wait()
    bad = torch.ones(part.dense_numel)
    bad[3] = float("nan")
    client.push(0, bad)
    transport.send(0, Header(Kind.PUSH, worker=0, clock=1, seq=1, version=0), [torch.ones(5)])
    transport.send(0, Header(Kind.PUSH, worker=0, clock=2, seq=2, version=0),
                   [torch.ones(part.dense_numel, dtype=torch.float64)])
    client.pull(3, flat)
    assert torch.equal(flat, before), "a rejected push changed the model"
    client.push(3, torch.ones(part.dense_numel))
    client.done(4, WorkerStats(steps=4, bytes_sent=transport.counter.sent).tensor())


def _rogue_run(tmp: Path, transport: str) -> tuple[dict, list[torch.Tensor]]:
    cfg = RunConfig.from_mapping({
        "model": "mlp", "data": "synthetic", "strategy": "asp", "workers": 1, "servers": 1,
        "lr": 1.0, "batch_size": 32, "max_steps": 4, "progress": False,
        "tensorboard": False, "out": str(tmp), "ps_timeout": 30.0,
        "transport": transport}).validate()
    job = make_job(cfg)
    job.run_dir.mkdir(parents=True, exist_ok=True)
    shm = make_run_tempdir(SHM_PREFIX, SHM_ROOT) if transport == "shm" else None
    try:
        spawn(_rogue, 2, (job, shm))
    finally:
        if shm:
            shutil.rmtree(shm, ignore_errors=True)
    out = read_result(job)
    return out.stats, [p.detach() for p in out.model.parameters()]


def test_a_shard_rejects_and_counts_bad_messages_over_shm_exactly_as_over_gloo(tmp_path):
    runs = {t: _rogue_run(tmp_path / t, t) for t in ("shm", "gloo")}
    for stats, _ in runs.values():
        assert stats["messages_rejected"] == 1  # the corrupted header
        assert stats["pushes_rejected"] == 3  # NaN, wrong length, wrong dtype
        assert stats["pushes_applied"] == 1
    keys = ("messages_rejected", "pushes_rejected", "pushes_applied", "pushes_lost",
            "duplicates", "staleness_histogram")
    assert {k: runs["shm"][0][k] for k in keys} == {k: runs["gloo"][0][k] for k in keys}
    init = make_job(RunConfig.from_mapping({"model": "mlp", "data": "synthetic"})).build_model()
    for p, q, r in zip(init.parameters(), runs["shm"][1], runs["gloo"][1]):
        assert torch.equal(q, r) and torch.equal(q, p.detach() - 1.0)  # the one good push


def test_asp_over_shm_equals_gloo_and_single_and_leaves_nothing_in_dev_shm(tmp_path):
    def run(**options):
        cfg = RunConfig.from_mapping({
            "model": "mlp", "data": "synthetic", "workers": 1, "servers": 2,
            "rule": "momentum", "lr": 0.02, "batch_size": 32, "max_steps": 30,
            "progress": False, "tensorboard": False, "out": str(tmp_path / str(options)),
            **options}).validate()
        return [p.detach() for p in train(config=cfg).model.parameters()]

    mine = lambda: list(Path(SHM_ROOT).glob(f"{SHM_PREFIX}{os.getpid()}-*"))  # noqa: E731
    before = mine()
    shm = run(strategy="asp", transport="shm")
    assert mine() == before == []
    gloo = run(strategy="asp", transport="gloo")
    ref = run(strategy="single")
    for a, b, c in zip(shm, gloo, ref):
        assert torch.equal(a, b) and torch.equal(a, c)
