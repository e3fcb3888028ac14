"""Compressed parameter-server traffic on the in-process transport: push bytes equal the
formula, the shard decodes what the worker meant (after error feedback), a hostile payload
is rejected, and compressed pulls keep the worker's copy equal to the shard's record of it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from phalanx.comm.compress import make_codec, parse_compress
from phalanx.comm.exchange import Compression, pull_deltas_for
from phalanx.comm.transport import InProcNetwork
from phalanx.comm.wire import HEADER_BYTES, Header, Kind
from phalanx.config import RunConfig
from phalanx.entry.api import make_job
from phalanx.parallel.ps import make_shard
from phalanx.parallel.registry import check_config
from phalanx.ps.client import PSClient
from phalanx.ps.partition import flat_dense, partition, trainable
from phalanx.ps.server import Layout

SERVERS = 2


def _setup(tmp_path: Path, compress: str):
    cfg = check_config(RunConfig(model="mlp", data="synthetic", strategy="asp", workers=1,
                    servers=SERVERS, compress=compress, progress=False, tensorboard=False,
                    out=str(tmp_path)))
    job = make_job(cfg)
    model = job.build_model()
    part = partition(model, SERVERS)
    layout = Layout(SERVERS, 1)
    net = InProcNetwork(layout.world)
    client = PSClient(net.transport(layout.worker_rank(0)), part, layout, 0)
    client.compression = Compression.from_config(cfg)
    shards = [make_shard(job, k) for k in range(SERVERS)]
    return job, part, net, client, shards, flat_dense(part, trainable(model))


@pytest.mark.parametrize("compress", ["fp16", "bf16", "int8", "topk:0.01", "randk:0.05"])
def test_push_bytes_and_decoding(tmp_path: Path, compress: str) -> None:
    job, part, net, client, shards, flat = _setup(tmp_path, compress)
    codec = make_codec(parse_compress(compress))
    gen = torch.Generator().manual_seed(0)
    for clock in range(3):
        g = torch.randn(flat.numel(), generator=gen)
        sent0 = client.transport.counter.sent
        client.push(clock, g, versions=[0] * SERVERS)
        want = sum(HEADER_BYTES + codec.payload_bytes(b - a)
                   for a, b in (part.dense_range(k) for k in range(SERVERS)))
        assert client.transport.counter.sent - sent0 == want  # bytes after compression
        for k, shard in enumerate(shards):
            msg = net.transport(k).recv(timeout_s=5)
            shard.buffer, before = [], shard.dense.clone()
            shard.handle(0, msg.header, msg.tensors)
            a, b = part.dense_range(k)
            # ASP applied it at once: the step is -lr * (what the worker's codec sent)
            expect = codec.decode(msg.tensors[0], b - a)
            assert torch.allclose(shard.dense, before - job.config.lr * expect, atol=1e-6)
    assert all(s.stats.pushes_applied == 3 for s in shards)


def test_hostile_compressed_push_is_rejected(tmp_path: Path) -> None:
    _, part, _, client, shards, _ = _setup(tmp_path, "topk:0.01")
    flags = client.compression.flags
    bogus = torch.tensor([10**8, 0], dtype=torch.int32)  # index far out of range
    shards[0].handle(0, Header(Kind.PUSH, worker=0, clock=0, shard=0, seq=0, flags=flags),
                     [bogus])
    assert shards[0].stats.pushes_rejected == 1
    assert "bad compressed gradient" in next(iter(shards[0].stats.reasons))


@pytest.mark.parametrize("compress", ["topk:0.05", "int8"])
def test_compressed_pulls_track_the_workers_copy(tmp_path: Path, compress: str) -> None:
    job, part, net, client, shards, flat = _setup(tmp_path, compress)
    for s in shards:
        s.pulls = pull_deltas_for(job.config)
    codec = make_codec(parse_compress(compress))
    servers = [net.transport(k) for k in range(SERVERS)]
    held = flat.clone()
    gen = torch.Generator().manual_seed(1)

    def serve() -> None:
        for k, shard in enumerate(shards):
            msg = servers[k].recv(timeout_s=5)
            for out in shard.handle(0, msg.header, msg.tensors):
                servers[k].send(out.worker + SERVERS, out.header, out.tensors)

    for clock in range(4):
        sent0 = [t.counter.sent for t in servers]
        th = threading.Thread(target=serve)
        th.start()
        client.pull(clock, held)  # answered by the shards' thread
        th.join()
        for k, shard in enumerate(shards):
            a, b = part.dense_range(k)
            # the worker's copy is what the shard thinks it is, bit for bit
            assert torch.equal(held[a:b], shard.pulls.copies[0])
            size = (b - a) * 4 if clock == 0 else codec.payload_bytes(b - a)  # first: full
            assert servers[k].counter.sent - sent0[k] == HEADER_BYTES + size
            if clock:  # and close to the shard's parameters (the rest comes next time)
                assert torch.allclose(held[a:b], shard.dense, atol=0.05)
        client.push(clock, torch.randn(flat.numel(), generator=gen) * 0.1,
                    versions=list(client.versions))
        for k, shard in enumerate(shards):
            msg = servers[k].recv(timeout_s=5)
            shard.handle(0, msg.header, msg.tensors)


# ---- an injected inf and an injected overflow in PS pushes ---------------------------------

PUSHES, INF_PUSH, BIG_PUSH = 6, 1, 3


@pytest.mark.parametrize("compress", ["none", "fp16", "bf16", "int8", "topk:0.01",
                                      "randk:0.05"])
def test_injected_inf_and_overflow_in_pushes(tmp_path: Path, compress: str) -> None:
    """One inf (push 1) and one value beyond the codec's range (push 3), both in shard 0's
    slice: the inf push is rejected (compressed: skipped by the worker, counted by the
    shard as the rejection it replaces), every other push is applied, the residuals and
    the shards' parameters stay finite (the issue: 1 applied, 5 rejected of 6)."""
    job, part, net, client, shards, flat = _setup(tmp_path, compress)
    if compress == "none":
        client.compression = None
    big = {"fp16": 7e4, "bf16": 3.39e38}.get(compress, 3e38)
    gen = torch.Generator().manual_seed(0)
    for clock in range(PUSHES):
        g = torch.randn(flat.numel(), generator=gen) * 0.01
        if clock == INF_PUSH:
            g[0] = float("inf")
        if clock == BIG_PUSH:
            g[1] = big
        client.push(clock, g, versions=[shard.version for shard in shards])
        for k, shard in enumerate(shards):
            msg = net.transport(k).recv(timeout_s=5)
            shard.handle(0, msg.header, msg.tensors)
            assert torch.isfinite(shard.dense).all(), (compress, clock, k)
    s0, s1 = shards[0].stats, shards[1].stats
    assert (s0.pushes_applied, s0.pushes_rejected) == (PUSHES - 1, 1), s0
    assert (s1.pushes_applied, s1.pushes_rejected) == (PUSHES, 0), s1
    reason = next(iter(s0.reasons))
    if compress == "none":
        assert "NaN or Inf in the gradient" in reason
        return
    assert "skipped a gradient holding NaN or inf" in reason
    screened = client.compression.screened
    assert screened.skipped == 1 and screened.clipped >= 1
    for k in range(SERVERS):
        assert torch.isfinite(client.compression.feedback.residual[k]).all()


def test_skipped_push_with_a_payload_is_rejected(tmp_path: Path) -> None:
    from phalanx.ps.shard import SKIPPED

    _, _, _, _, shards, _ = _setup(tmp_path, "int8")
    shards[0].handle(0, Header(Kind.PUSH, worker=0, clock=0, shard=0, seq=0, flags=SKIPPED),
                     [torch.zeros(3)])
    assert shards[0].stats.pushes_rejected == 1 and shards[0].clocks[0] == 1
    assert "a skipped push carries a payload" in next(iter(shards[0].stats.reasons))


# ---- compressed pulls: the integrity check -------------------------------------------------

def _pull_drift(tmp_path: Path, compress: str, check_every: int, pulls: int = 60,
                lost: int = 5) -> tuple[float, list]:
    """``pulls`` compressed pulls with a push between them; the reply to pull ``lost`` never
    reaches the worker (its copy stays as it was, as if the message were lost and the
    worker went on). Returns (max |worker copy - shard parameters| after the last pull,
    the shards)."""
    job, part, net, client, shards, flat = _setup(tmp_path / f"{check_every}", compress)
    client.check_every = check_every
    for s in shards:
        s.pulls = pull_deltas_for(job.config)
    servers = [net.transport(k) for k in range(SERVERS)]
    held = flat.clone()
    gen = torch.Generator().manual_seed(2)

    def serve() -> None:
        for k, shard in enumerate(shards):
            msg = servers[k].recv(timeout_s=5)
            for out in shard.handle(0, msg.header, msg.tensors):
                servers[k].send(out.worker + SERVERS, out.header, out.tensors)

    for clock in range(pulls):
        before = held.clone()
        th = threading.Thread(target=serve)
        th.start()
        client.pull(clock, held)
        th.join()
        if clock == lost:
            a, b = part.dense_range(0)
            held[a:b] = before[a:b]  # shard 0's reply was lost
        if clock == pulls - 1:
            break  # measured right after the last pull
        client.push(clock, torch.randn(flat.numel(), generator=gen) * 0.5,
                    versions=list(client.versions))
        for k, shard in enumerate(shards):
            msg = servers[k].recv(timeout_s=5)
            shard.handle(0, msg.header, msg.tensors)
    a, b = part.dense_range(0)
    return float((held[a:b] - shards[0].dense).abs().max()), shards


@pytest.mark.parametrize("compress", ["int8", "topk:0.05"])
def test_a_lost_pull_reply_is_found_and_resynced(tmp_path: Path, compress: str) -> None:
    drift, _ = _pull_drift(tmp_path, compress, check_every=10**9)  # never checked
    fixed, shards = _pull_drift(tmp_path, compress, check_every=16)
    clean, _ = _pull_drift(tmp_path, compress, check_every=10**9, lost=-1)  # nothing lost
    print(f"{compress}: worker-to-shard error after 60 pulls, one reply lost: "
          f"unchecked {drift:.2e}, checked every 16th pull {fixed:.2e}, no loss {clean:.2e}")
    assert shards[0].stats.pull_resyncs == 1 and shards[1].stats.pull_resyncs == 0
    assert drift > 10 * clean  # the drift is permanent without the check
    assert fixed <= 2 * clean + 1e-6  # with it, the copy is back on track


def test_a_bad_checksum_payload_is_rejected(tmp_path: Path) -> None:
    from phalanx.ps.shard import CHECKED, WANT_DENSE

    _, _, _, client, shards, _ = _setup(tmp_path, "int8")
    flags = WANT_DENSE | CHECKED | client.compression.flags
    for bad in ([], [torch.zeros(1)], [torch.zeros(2, dtype=torch.int64)]):
        shards[0].handle(0, Header(Kind.PULL, worker=0, clock=0, shard=0, flags=flags), bad)
    assert shards[0].stats.messages_rejected == 3 and not shards[0].parked
