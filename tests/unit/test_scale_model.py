"""phalanx.scale's analytical model held to hand-computed cases: each test fails when a
formula, a phase's sharing or the overlap timeline is wrong."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from phalanx.errors import ConfigError
from phalanx.scale import collectives as C
from phalanx.scale.network import Network, network_from_mapping
from phalanx.scale.overlap import assign_buckets, bucket_timeline
from phalanx.scale.predict import predict
from phalanx.scale.setting import Compression, Setting, Stragglers
from phalanx.scale.workload import Layer, Workload

THREE_HOSTS = {
    "name": "three",
    "device_types": [{"name": "v100"}],
    "zones": [{"name": "z", "racks": [{"name": "r", "servers": [
        {"name": "h", "repeat": 3, "device_type": "v100", "devices": 1,
         "cpu_cores": 8, "memory_gib": 64}]}]}],
    "links": {"nic": {"gbit": 1, "latency_us": 100}},
}


def three_hosts() -> Network:
    return network_from_mapping(THREE_HOSTS, "three.yaml")


def test_ring_step_on_three_hosts_by_hand() -> None:
    """3 hosts, one worker each, 1 Gbit/s NICs, 100 us per message, X = 3 MB: a ring does
    2(N-1) = 4 steps of X/N = 1 MB; each step 100 us + 1e6 B / 125e6 B/s = 8.1 ms."""
    net = three_hosts()
    cost = C.ring(net, [0, 1, 2], 3e6)
    assert cost.seconds == pytest.approx(4 * (100e-6 + 1e6 / 125e6), rel=1e-12)
    assert cost.bytes_per_worker == pytest.approx(2 * 3e6 * 2 / 3)
    assert cost.bottleneck == "nic"
    # the whole step: compute 50 ms, no overlap (bucket 0) -> 50 + 32.4 ms
    w = Workload(name="toy", layers=(Layer(name="a", params=750_000, compute_share=1.0),),
                 batch=10, step_compute_s=0.05)
    p = predict(w, Setting(strategy="sync", workers=3, bucket_mb=0), net)
    assert p.step_s == pytest.approx(0.05 + 4 * (100e-6 + 1e6 / 125e6), rel=1e-12)
    assert p.efficiency == pytest.approx(0.05 / p.step_s)


def test_main_node_incast_on_three_hosts_by_hand() -> None:
    """Main node: 2 workers send X to host 0 at once (its NIC receives 2X), then it sends 2X."""
    cost = C.main_node(three_hosts(), [0, 1, 2], 1e6)
    assert cost.seconds == pytest.approx(2 * (100e-6 + 2e6 / 125e6), rel=1e-12)
    assert cost.bytes_per_worker == 2e6


def test_main_node_s_next_gather_overlaps_a_broadcast_sent_in_turn() -> None:
    """Host 0 sends the sum to each worker in turn (calibrated share 1): the first has it
    at half the broadcast (2 MB at 125 MB/s: 8 ms of 16) and sends its next tensor while
    host 0 still sends to the other, so an exchange costs the gather (16.1 ms) and half the
    broadcast: 3X/B, not 4X/B. Half in turn: 3/4 of it; at N = 2 there is no one to
    overlap; the share between calibrated sizes is linear in log(bytes)."""
    from phalanx.scale.network import Link, Links, uniform_network

    def net(n, fanout):
        return uniform_network(n, gpus_per_server=1, links=Links(
            nic=Link(bandwidth=125e6, latency=100e-6, fanout=fanout),
            rack=Link(bandwidth=1e12)))
    phase = 100e-6 + 2e6 / 125e6
    shared = C.main_node(net(3, ()), [0, 1, 2], 1e6)
    assert shared.seconds == pytest.approx(2 * phase, rel=1e-12)  # as before: fluid
    turn = C.main_node(net(3, ((1e5, 1.0), (1e7, 0.0))), [0, 1, 2], 1e5)
    assert turn.seconds == pytest.approx(1.5 * (100e-6 + 2e5 / 125e6), rel=1e-12)
    half = C.main_node(net(3, ((1e5, 1.0), (1e7, 0.0))), [0, 1, 2], 1e6)  # log-midway
    assert half.seconds == pytest.approx(1.75 * phase, rel=1e-12)
    assert half.bytes_per_worker == 2e6 and half.messages == 2
    # 4 workers, in turn: the first has it at a third of the broadcast
    four = C.main_node(net(4, ((1e6, 1.0),)), [0, 1, 2, 3], 1e6)
    assert four.seconds == pytest.approx((1 + 1 / 3) * (100e-6 + 3e6 / 125e6), rel=1e-12)
    two = C.main_node(net(2, ((1e6, 1.0),)), [0, 1], 1e6)
    assert two.seconds == pytest.approx(2 * (100e-6 + 1e6 / 125e6), rel=1e-12)
    link = Link(bandwidth=1.0, fanout=((1e5, 0.8), (1e7, 0.2)))
    assert [link.in_turn(b) for b in (1e4, 1e5, 1e6, 1e7, 1e9)] == pytest.approx(
        [0.8, 0.8, 0.5, 0.2, 0.2])
    with pytest.raises(ConfigError, match="fanout"):
        Link(bandwidth=1.0, fanout=((1e5, 1.5),))


def test_ring_bytes_match_comm_allreduce() -> None:
    """The torch-free copy of the byte formula equals phalanx.comm.allreduce.ring_bytes."""
    from phalanx.comm.allreduce import ring_bytes as real
    for numel in (1, 7, 100, 235_146):
        for world in (2, 3, 4, 7, 16):
            for rank in range(world):
                assert C.ring_bytes(numel, 4, world, rank) == real(numel, 4, world, rank)


def test_a_latency_hides_behind_the_bytes_on_a_token_bucket_link() -> None:
    """3 test hosts, links of 1 MB/s, 1 ms a message, a 50 KB bucket; a ring of 300 KB:
    4 phases of 100 KB (0.1 s each). While a phase's latency keeps the link idle the
    bucket refills 1 ms of tokens, which its bytes take back at line rate: back to back the
    ring takes 4 x (1 + 100 - 1) ms = 0.4 s, its bytes' time alone (the additive alpha-beta
    sum: 0.404 s); after a long idle gap the full bucket saves 50 ms more: 0.35 s. What
    gloo's messages did in calibration (262 KB at 100 Mbit/s: 2.47 ms over a full bucket,
    2.43 ms of bytes beyond it, none of its 0.8 ms latency). A latency-bound ring (100 B
    chunks, 0.1 ms of bytes) still pays its latencies: 4 x 1 ms."""
    from phalanx.scale.network import Link, hosts_network
    net = hosts_network(3, Link(bandwidth=1e6, latency=1e-3, burst=5e4))
    big = C.ring(net, [0, 1, 2], 3e5)
    assert big.seconds + big.credit_s == pytest.approx(0.4, rel=1e-9)
    assert big.seconds == pytest.approx(0.35, rel=1e-9)
    assert big.hidden_s == pytest.approx(0.004, rel=1e-9)
    small = C.ring(net, [0, 1, 2], 300.0)
    assert small.seconds + small.credit_s == pytest.approx(4e-3, rel=1e-9)
    # no bucket (a published cluster's links): the plain alpha-beta sum
    plain = C.ring(hosts_network(3, Link(bandwidth=1e6, latency=1e-3)), [0, 1, 2], 3e5)
    assert plain.seconds == pytest.approx(0.404, rel=1e-9) and plain.hidden_s == 0.0


def test_a_pipeline_send_takes_at_least_its_latency() -> None:
    """2 stages on the token-bucket hosts above (1 MB/s, 1 ms, 50 KB), 4 micro-batches of
    500 B activations, no compute to speak of: each of the 8 sends (4 forward, 4 back, one
    after another on the critical path) has its 0.5 ms of bytes covered by the bucket and
    costs its 1 ms latency: 8 ms. (A run of four sends shares the idle gap's credit; without
    the floor a send came out at 0.75 ms, below its own latency.)"""
    from phalanx.scale.network import Link, hosts_network
    net = hosts_network(2, Link(bandwidth=1e6, latency=1e-3, burst=5e4))
    w = Workload(name="two", layers=(Layer(name="a", params=10, compute_share=1.0),
                                     Layer(name="b", params=10, compute_share=1.0)),
                 batch=4, step_compute_s=1e-9, activation_bytes=500.0)
    p = predict(w, Setting(strategy="pipeline", workers=2, micro_batches=4), net)
    assert p.exposed_comm_s == pytest.approx(8e-3, rel=1e-3)


def test_buckets_match_comm_bucketing() -> None:
    import torch

    from phalanx.comm.bucketing import assign_buckets as real
    sizes = [200_704, 256, 32_768, 128, 1_280, 10, 5_000_000, 3]
    for cap in (1_000, 100_000, 1 << 20, 25 << 20):
        assert assign_buckets([s * 4 for s in sizes], cap) == real(
            sizes, [torch.float32] * len(sizes), cap)


def test_overlap_timeline_by_hand() -> None:
    """Two layers, backward 0.6 s (2/3 of 0.9): layer 1 done at 0.3, layer 0 at 0.6. Each
    bucket costs 0.5 s: bucket of layer 1 runs 0.3-0.8, layer 0's 0.8-1.3: exposed 0.7."""
    w = Workload(name="two", layers=(Layer(name="a", params=100, compute_share=1.0),
                                     Layer(name="b", params=100, compute_share=1.0)),
                 batch=1, step_compute_s=0.9)
    tl = bucket_timeline(w, 400, lambda b: 0.5)
    assert (tl.buckets, tl.backward_s) == (2, pytest.approx(0.6))
    assert tl.exposed_s == pytest.approx(0.7)
    assert bucket_timeline(w, 0, lambda b: 0.5).exposed_s == pytest.approx(0.5)


def test_horovod_fusion_closes_a_bucket_on_its_cycle_or_its_bytes() -> None:
    """Backward order 3, 2, 1, 0 taking 2, 2, 4, 1 ms; bytes 10, 10, 10, 100. A 3 ms cycle
    closes {3, 2} at 4 ms of backward (the layer that crossed stays), then {1} at 8 ms;
    {0} is left at the end. A 15-byte cap closes {3, 2} at 20 bytes, {1, 0} at 110. By
    hand on a workload: four layers share a 0.9 s step's 0.6 s backward, 0.15 s each; a
    0.25 s cycle closes after two: buckets ready at 0.3 and 0.6 s; each costs 0.5 s: 0.3-0.8,
    0.8-1.3: exposed 0.7 (DDP's 1-byte cap: four buckets, 0.15-0.65 ... 1.65-2.15: 1.55)."""
    from phalanx.scale.overlap import fusion_buckets
    sizes, ms = [100, 10, 10, 10], [1e-3, 4e-3, 2e-3, 2e-3]
    assert fusion_buckets(sizes, ms, 1 << 30, 3e-3) == [[3, 2], [1], [0]]
    assert fusion_buckets(sizes, ms, 15, 1.0) == [[3, 2], [1, 0]]
    w = Workload(name="four", layers=tuple(Layer(name=f"l{i}", params=1, compute_share=1.0)
                                           for i in range(4)), batch=1, step_compute_s=0.9)
    tl = bucket_timeline(w, 1 << 30, lambda b: 0.5, cycle_s=0.25)
    assert tl.buckets == 2 and tl.exposed_s == pytest.approx(0.7)
    assert bucket_timeline(w, 1, lambda b: 0.5).exposed_s == pytest.approx(1.55)
    with pytest.raises(ConfigError, match="--fusion-cycle-ms"):
        Setting(strategy="sync", workers=2, fusion_cycle_ms=-1)


def hosts(servers: int, devices: int, links: dict | None = None) -> Network:
    data = {**THREE_HOSTS, "zones": [{"name": "z", "racks": [{"name": "r", "servers": [
        {"name": "h", "repeat": servers, "device_type": "v100", "devices": devices,
         "cpu_cores": 8, "memory_gib": 64}]}]}],
        "links": links if links is not None else THREE_HOSTS["links"]}
    return network_from_mapping(data, "hosts.yaml")


def test_hierarchical_and_tree_move_ring_bytes_faster_on_many_servers() -> None:
    net = hosts(16, 8, {"nic": {"gbit": 25, "latency_us": 10}})
    devices = list(range(128))
    ring, hier, tree = (C.ring(net, devices, 1e8), C.hierarchical(net, devices, 1e8),
                        C.tree(net, devices, 1e8))
    # far fewer latency terms for hierarchical: 2 x 7 inside + 2 x 15 across servers
    assert hier.messages == 2 * 7 + 2 * 15 and ring.messages == 2 * 127
    assert hier.seconds < ring.seconds and tree.seconds < ring.seconds
    assert tree.bytes_per_worker == pytest.approx(2 * 1e8 * 127 / 128)


def test_ps_incast_phase_by_hand() -> None:
    """6 workers (2 per host on 3 hosts) push 1 MB each to one dedicated shard: its NIC takes
    6 MB at 125 MB/s = 48 ms (+ 100 us); each worker host's NIC only 2 MB."""
    net = hosts(3, 2)
    big = net.with_extra(1)
    push, pull = C.ps_exchange(big, list(range(6)), [6], [1.0], 1e6, 1e6, duplex=False)
    assert push.seconds == pytest.approx(100e-6 + 5e-6 + 5e-6 + 6e6 / 125e6, rel=1e-9)
    assert pull.seconds == pytest.approx(push.seconds)
    assert push.bottleneck == "nic"
    # two shards halve the incast; the worker hosts' NICs (2 MB out) now tie with them
    two = net.with_extra(2)
    push2, _ = C.ps_exchange(two, list(range(6)), [6, 7], [0.5, 0.5], 1e6, 1e6, duplex=False)
    assert push2.seconds == pytest.approx(110e-6 + 3e6 / 125e6, rel=1e-9)


def test_sparse_rows_and_compression() -> None:
    from phalanx.scale.workload import Sparse
    s = Sparse(rows=10, dim=4, zipf_s=0.0, lookups=1)  # uniform ids
    assert s.unique_rows(10) == pytest.approx(10 * (1 - 0.9 ** 10))
    assert Compression.parse("fp16").dense_scale == 0.5
    assert Compression.parse("ratio:4").dense_scale == 0.25
    for bad in ("topk:0", "ratio:0.5", "gzip", "topk:x"):
        with pytest.raises(ConfigError, match="--compress"):
            Compression.parse(bad)


def test_ctr_table_rows_follow_the_data_s_vocabularies() -> None:
    """The per-field model (Zipf over each field's vocabulary, hashed to id % rows) against
    the distinct rows the CTR model really reads from --data ctr-synthetic batches: within
    1.5% for seeds 0 and 1, hashed to 4,096 rows (most fields collide) and 32,768; the
    one-Zipf-over-the-table model it replaced was 6% off for seed 0 and cannot tell seeds
    apart."""
    import torch

    from phalanx.data.ctr import click_log, vocab_sizes
    from phalanx.scale.workload import Sparse
    for seed in (0, 1):
        tx, _, _, _, info = click_log(seed, train=8192, test=1)
        assert vocab_sizes(seed) == tuple(info["vocab_sizes"])
        ids = tx[:, 13:].long()
        for field_rows in (4096, 32768):
            rows = ids.remainder(field_rows) + torch.arange(26) * field_rows
            seen = sum(rows[i : i + 256].unique().numel() for i in range(0, 8192, 256)) / 32
            model = Sparse(rows=26 * field_rows, dim=16, zipf_s=1.1, lookups=26,
                           vocab=vocab_sizes(seed), field_rows=field_rows)
            assert model.unique_rows(256) == pytest.approx(seen, rel=0.015)
    with pytest.raises(ConfigError, match="sparse table"):
        Sparse(rows=10, dim=4, zipf_s=1.1, lookups=2, vocab=(5,), field_rows=5)


def test_stragglers_and_settings_refuse_bad_values() -> None:
    assert Stragglers("slow:1:3").expected_max(8) == 3.0
    assert Stragglers("slow:2:3").mean(4) == pytest.approx(2.0)
    assert 1.0 < Stragglers("lognormal:0.5").expected_max(64) < 4.0
    for bad, flag in (({"strategy": "nope"}, "--strategy"), ({"workers": 0}, "--workers"),
                      ({"strategy": "tensor", "workers": 6, "tensor": 4}, "--tensor"),
                      ({"bucket_mb": -1}, "--bucket-mb")):
        with pytest.raises(ConfigError, match=flag):
            Setting(**{"strategy": "sync", "workers": 4, **bad})
    with pytest.raises(ConfigError, match="--stragglers"):
        Stragglers("lognormal:9")


def test_every_strategy_predicts_and_parts_add_up() -> None:
    from phalanx.scale.setting import STRATEGIES
    from phalanx.scale.sweep import Shape, default_setting
    from phalanx.scale.workload import catalog
    w = catalog("gpt2")
    net = Shape().network(8)
    for s in STRATEGIES:
        p = predict(w, default_setting(s, 1 if s == "single" else 8), net)
        assert p.step_s > 0 and math.isfinite(p.efficiency), s
        if s not in ("asp", "ssp", "softsync", "downpour", "dc-asgd"):
            parts = p.compute_s + p.exposed_comm_s + p.server_s + p.bubble_s + p.straggler_s
            assert p.step_s == pytest.approx(parts), s


def test_pipeline_bubble_formula() -> None:
    """With free sends the bubble is (P-1)/(M+P-1) of the step."""
    from phalanx.scale.sweep import Shape
    from phalanx.scale.workload import catalog
    w = catalog("gpt2")
    net = Shape(intra_gbit=1e5, latency_us=0).network(4)
    p = predict(w, Setting(strategy="pipeline", workers=4, micro_batches=12), net)
    assert p.bubble_s / p.step_s == pytest.approx(3 / 15, rel=1e-3)


def test_analytical_core_imports_no_torch() -> None:
    code = ("import sys, phalanx.scale.predict, phalanx.scale.eventsim, phalanx.scale.sweep, "
            "phalanx.scale.published; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_cluster_links_are_checked() -> None:
    for links, word in (({"spine": {"gbit": 1}}, "unknown level"),
                        ({"nic": {"gbit": -1}}, "bandwidth"),
                        ({"nic": {"speed": 1}}, "gbit"),
                        ({"rack": {"oversubscription": 0.5}}, "oversubscription")):
        with pytest.raises(ConfigError, match=word):
            network_from_mapping({**THREE_HOSTS, "links": links}, "x.yaml")


def test_convergence_by_hand() -> None:
    """Pollux's efficiency with var/sqr = r at the initial batch B0: at k B0 the gain per step
    is (r + 1) / (r / k + 1), so steps = base (r / k + 1) / (r + 1)."""
    from phalanx.scale.convergence import Convergence
    c = Convergence(base_steps=1000, init_batch=100, noise_ratio=3.0, staleness_slope=0.1)
    assert c.steps(100) == pytest.approx(1000)
    assert c.steps(400) == pytest.approx(1000 * (3 / 4 + 1) / 4)
    assert c.steps(100, staleness=5) == pytest.approx(1500)


def test_profile_here_reads_the_model() -> None:
    from phalanx.scale.profile import profile_model
    w = profile_model("mlp", 4, repeats=1)
    assert w.params == 235_146 and w.step_compute_s > 0
    assert w.activation_bytes == 784 * 4 and w.compute_source.startswith("profile")
    with pytest.raises(ConfigError, match="--model"):
        profile_model("alexnet", 4)


def test_sharded_data_parallel_by_hand() -> None:
    """ZeRO / FSDP on the 3-host ring: a reduce-scatter and an all-gather are each half of
    the ring allreduce (2 of its 4 steps). Stage 1: both after backward (no overlap);
    stage 3: two gathers and a reduce-scatter, 1.5x sync's bytes, all on the critical path
    in phalanx's zero; FSDP2 hides forward's gather behind forward (and is never faster
    than sync, which moves 2/3 of its bytes behind the same backward)."""
    net = three_hosts()
    w = Workload(name="toy", layers=(Layer(name="a", params=750_000, compute_share=1.0),),
                 batch=10, step_compute_s=0.05)
    step = 100e-6 + 1e6 / 125e6  # one ring step of X/N = 1 MB
    sync = predict(w, Setting(strategy="sync", workers=3, bucket_mb=0), net)
    one = predict(w, Setting(strategy="zero", zero_stage=1, workers=3), net)
    three = predict(w, Setting(strategy="zero", zero_stage=3, workers=3), net)
    fsdp = predict(w, Setting(strategy="fsdp", workers=3), net)
    assert one.step_s == pytest.approx(0.05 + 4 * step, rel=1e-12)
    assert one.bytes_per_worker == pytest.approx(sync.bytes_per_worker)
    assert three.step_s == pytest.approx(0.05 + 6 * step, rel=1e-12)
    assert three.bytes_per_worker == pytest.approx(1.5 * sync.bytes_per_worker)
    assert fsdp.bytes_per_worker == pytest.approx(three.bytes_per_worker)
    synced = predict(w, Setting(strategy="sync", workers=3), net)
    assert synced.step_s <= fsdp.step_s < three.step_s
    with pytest.raises(ConfigError, match="--zero-stage: 4"):
        Setting(strategy="zero", zero_stage=4, workers=3)


def test_token_bucket_credit_is_at_most_the_links_idle_time() -> None:
    """A ring at N = 2 on 20 Mbit/s links with tbf's 153 KB burst, one 943 KB bucket after
    backward: the links are idle only during compute, so a step's credit is
    min(burst / rate, compute), not the whole burst. 8 ms of compute: the step is the
    exchange's time with no credit (943 KB at the rate: 377 ms); 200 ms of compute: the
    full credit (61 ms) comes off."""
    from phalanx.scale.network import Link, Links, uniform_network
    rate, burst, grad = 20e6 / 8, 153e3, 943_000
    net = uniform_network(2, gpus_per_server=1, links=Links(
        nic=Link(bandwidth=rate, burst=burst), rack=Link(bandwidth=1e12)))
    s = Setting(strategy="sync", workers=2, allreduce="ring")
    for compute, credit in ((0.008, 0.008), (0.2, burst / rate)):
        layer = Layer(name="l", params=grad // 4, compute_share=1.0)
        w = Workload(name="w", layers=(layer,), batch=32, step_compute_s=compute)
        p = predict(w, s, net)
        assert p.step_s == pytest.approx(compute + grad / rate - credit, rel=1e-6)


def test_main_node_directions_rest_in_turn_and_keep_their_credit() -> None:
    """The main node gathers, then broadcasts: each direction of a link is idle while the
    other works, so each keeps its whole token bucket even with little compute (N = 2: up
    943 KB, then down 943 KB, each less the 153 KB burst)."""
    from phalanx.scale.network import Link, Links, uniform_network
    rate, burst, grad, compute = 20e6 / 8, 153e3, 943_000, 0.008
    net = uniform_network(2, gpus_per_server=1, links=Links(
        nic=Link(bandwidth=rate, burst=burst), rack=Link(bandwidth=1e12)))
    layer = Layer(name="l", params=grad // 4, compute_share=1.0)
    w = Workload(name="w", layers=(layer,), batch=32, step_compute_s=compute)
    p = predict(w, Setting(strategy="sync", workers=2, allreduce="main"), net)
    assert p.step_s == pytest.approx(compute + 2 * (grad - burst) / rate, rel=1e-6)


def _ps_net(n: int, rate: float, burst: float, duplex: float = 1.0) -> Network:
    from phalanx.scale.network import Link, Links, uniform_network
    return uniform_network(n, gpus_per_server=1, links=Links(
        nic=Link(bandwidth=rate, burst=burst, duplex=duplex), rack=Link(bandwidth=1e12),
        zone=Link(bandwidth=1e12)))


def test_ps_push_then_pull_each_direction_keeps_its_bucket() -> None:
    """BSP, N = 2 workers, 2 dedicated shards, 20 Mbit/s links with a 116 KB burst, 400 KB
    of gradient: the push (400 KB up each worker's link; each shard takes 400 KB, as fast)
    then the pull; each direction rests while the other works, so each keeps its bucket:
    compute + 2 x (400 KB - 116 KB) / rate (+ the shards' apply). Merged into one machine
    of two NICs, the shards keep two buckets: the credit is the same on either side."""
    rate, burst, grad, compute = 20e6 / 8, 116e3, 400_000, 0.01
    layer = Layer(name="l", params=grad // 4, compute_share=1.0)
    w = Workload(name="w", layers=(layer,), batch=32, step_compute_s=compute)
    s = Setting(strategy="bsp", workers=2, servers=2, server_msg_s=0.0, server_byte_s=0.0)
    p = predict(w, s, _ps_net(2, rate, burst))
    assert p.step_s == pytest.approx(compute + 2 * (grad - burst) / rate, rel=1e-9)
    # a direction refills only while it rests: with no compute and a push of a tenth the
    # bytes (40 KB, inside its bucket: no time), the pull's bucket refills for the push's
    # 16 ms only: 400 KB less 40 KB of credit
    small = Workload(name="w", layers=(layer,), batch=32, step_compute_s=1e-12)
    q = predict(small, Setting(strategy="bsp", workers=2, servers=2, server_msg_s=0.0,
                               server_byte_s=0.0, compress=Compression.parse("ratio:10")),
                _ps_net(2, rate, burst))
    assert q.step_s == pytest.approx((grad - grad / 10) / rate, rel=1e-9)


def test_asp_shards_serve_pushes_and_pulls_at_once() -> None:
    """ASP, N = 4 workers onto one dedicated shard, 1 MB/s links (no bucket), duplex 0.8,
    1 MB of gradient, no compute: the shard's link carries 4 MB in and 4 MB out a round,
    both directions at once at 0.8 of the rate: 4 / 0.8 = 5 s a step (pushes then pulls
    one after the other: 8 s); a worker alone needs 2 s."""
    grad = 1_000_000
    layer = Layer(name="l", params=grad // 4, compute_share=1.0)
    w = Workload(name="w", layers=(layer,), batch=32, step_compute_s=1e-12)
    s = Setting(strategy="asp", workers=4, servers=1, server_msg_s=0.0, server_byte_s=0.0)
    p = predict(w, s, _ps_net(4, 1e6, 0.0, duplex=0.8))
    assert p.step_s == pytest.approx(4 * grad / 1e6 / 0.8, rel=1e-9)
    one = predict(w, Setting(strategy="asp", workers=1, servers=1, server_msg_s=0.0,
                             server_byte_s=0.0), _ps_net(4, 1e6, 0.0, duplex=0.8))
    assert one.step_s == pytest.approx(2 * grad / 1e6, rel=1e-9)


def test_model_parallel_and_pipeline_critical_paths_by_hand() -> None:
    """1 MB/s links, no bucket, no latency; a batch of 10 samples x 10 KB of activations at
    a cut = 100 KB a send (0.1 s). Model parallel over P = 3 stages,
    90 ms of compute: the batch goes forward through both links and back: 90 ms + 4 sends
    (not 6: each stage's two sends counted once). GPipe, P = 2, M = 4 micro-batches of
    25 KB (25 ms a send), compute 10 ms a micro-batch on a stage (f 10/3, b 20/3 ms):
    P (f + b) + 2 (P - 1) s + (M - 1)(max(f, s) + max(b, s)) = 20 + 50 + 150 ms; and a
    link no faster than its rate: with a 1 MB bucket the sends would be free, but 4 x 25 KB
    each way a step at 1 MB/s take 100 ms, so the step is at least that."""
    layer = Layer(name="l", params=1000, compute_share=1.0)
    w = Workload(name="w", layers=(layer,), batch=10, step_compute_s=0.09,
                 activation_bytes=10_000)
    mp = predict(w, Setting(strategy="model-parallel", workers=3), _ps_net(3, 1e6, 0.0))
    assert mp.step_s == pytest.approx(0.09 + 4 * 0.1, rel=1e-9)
    w2 = Workload(name="w", layers=(layer,), batch=10, step_compute_s=0.08,
                  activation_bytes=10_000)
    pipe = predict(w2, Setting(strategy="pipeline", workers=2, micro_batches=4),
                   _ps_net(2, 1e6, 0.0))
    f, b, s = 0.01 / 3, 0.02 / 3, 0.025
    assert pipe.step_s == pytest.approx(2 * (f + b) + 2 * s + 3 * (s + s), rel=1e-9)
    assert pipe.bubble_s == pytest.approx(f + b, rel=1e-9)
    fast = predict(w2, Setting(strategy="pipeline", workers=2, micro_batches=4),
                   _ps_net(2, 1e6, 1e6))
    assert fast.step_s == pytest.approx(4 * 0.025, rel=1e-9)


def test_each_cut_carries_its_own_activations_and_a_stage_s_nic_both_its_sends() -> None:
    """Model parallel over 3 stages whose cuts carry 10 and 5 KB a sample (the MLP's are
    1,024 and 512 bytes), a batch of 10, 1 MB/s, no latency, 90 ms of compute: sends of
    0.1 and 0.05 s, each cut crossed forward and back: 90 ms + 2 x 0.15 s. With a 1 MB
    bucket every send would be free, but the middle stage's NIC moves 100 KB of
    activations forward and 50 KB of gradients back a step: 0.15 s at the rate, so the
    step (30 ms of compute a stage, a 60 ms bubble) is 0.15 s. Its busiest stage sends
    150 KB (the middle one), not 2 x 100."""
    layer = Layer(name="l", params=1000, compute_share=1.0)
    w = Workload(name="w", layers=(layer,), batch=10, step_compute_s=0.09,
                 activation_bytes=10_000, cut_bytes=((10_000.0,), (10_000.0, 5_000.0)))
    assert w.cuts(3) == (10_000.0, 5_000.0) and w.cuts(4) == (10_000.0,) * 3
    mp = predict(w, Setting(strategy="model-parallel", workers=3), _ps_net(3, 1e6, 0.0))
    assert mp.step_s == pytest.approx(0.09 + 2 * 0.15, rel=1e-9)
    assert mp.bytes_per_worker == pytest.approx(150_000, rel=1e-9)
    fast = predict(w, Setting(strategy="model-parallel", workers=3), _ps_net(3, 1e6, 1e6))
    assert fast.step_s == pytest.approx(0.15, rel=1e-9)


def test_a_middle_stage_s_nic_refills_before_its_forward_and_its_backward_sends() -> None:
    """Model parallel over 3 stages, 100 KB a send (0.1 s at 1 MB/s), a 50 KB bucket, 90 ms
    of compute (30 ms a stage, a 60 ms bubble). Every NIC rests long enough to refill
    between its runs of sends: the first stage's before its forward send, the last's before
    its backward one, the middle stage's before each of its two: every send saves 50 ms,
    0.05 s each of the four: 0.09 + 0.2 s. (One bucket a step for the middle stage, shared
    by its two sends: 0.075 s each of those, 0.34 s.)"""
    layer = Layer(name="l", params=1000, compute_share=1.0)
    w = Workload(name="w", layers=(layer,), batch=10, step_compute_s=0.09,
                 activation_bytes=10_000)
    mp = predict(w, Setting(strategy="model-parallel", workers=3), _ps_net(3, 1e6, 50e3))
    assert mp.step_s == pytest.approx(0.09 + 4 * 0.05, rel=1e-9)


def test_zero_buckets_refill_only_in_the_gaps_between_its_collectives() -> None:
    """ZeRO on 2 hosts, 1 MB/s links with a 300 KB bucket, 1 MB of gradient, 100 ms of
    compute (forward 1/3): each half-collective moves 500 KB a direction (0.5 s). Stage 1
    runs its reduce-scatter and all-gather back to back after backward: one gap (the
    compute, 0.1 s) refills 0.1 s of credit: 0.1 + 1.0 - 0.1. Stage 3 gathers, runs
    forward, gathers, runs backward, reduce-scatters: two gaps (1/30 and 2/30 s):
    0.1 + 1.5 - 0.1."""
    layer = Layer(name="l", params=250_000, compute_share=1.0)
    w = Workload(name="w", layers=(layer,), batch=8, step_compute_s=0.1)
    net = _ps_net(2, 1e6, 300e3)
    one = predict(w, Setting(strategy="zero", zero_stage=1, workers=2), net)
    assert one.step_s == pytest.approx(0.1 + 1.0 - 0.1, rel=1e-9)
    three = predict(w, Setting(strategy="zero", zero_stage=3, workers=2), net)
    assert three.step_s == pytest.approx(0.1 + 1.5 - 0.1, rel=1e-9)
    # with a second of compute each gap refills a whole bucket (0.3 s): one for stage 1,
    # two for stage 3
    slow = Workload(name="w", layers=(layer,), batch=8, step_compute_s=1.0)
    assert predict(slow, Setting(strategy="zero", zero_stage=1, workers=2), net).step_s == \
        pytest.approx(1.0 + 1.0 - 0.3, rel=1e-9)
    assert predict(slow, Setting(strategy="zero", zero_stage=3, workers=2), net).step_s == \
        pytest.approx(1.0 + 1.5 - 0.3 - 0.3, rel=1e-9)


def test_zero_3_runs_phalanx_s_units_one_collective_after_another() -> None:
    """Stage 3 with the units phalanx gathers (``Layer.unit``): 2 hosts, 1 MB/s links with
    a 300 KB bucket, two units of 500 KB (each half-collective 250 KB a direction: 0.25 s),
    0.6 s of compute (forward 0.1 s and backward 0.2 s a unit). In order, with the compute
    before each (what refills its credit): gather a (0: 0.25 s), gather b (0.1: 0.15),
    gather b again (0.1: 0.15), reduce-scatter b (0.2: 0.05), gather a again (0: 0.25),
    reduce-scatter a (0.2: 0.05): 0.9 s. The whole-model formula has two gaps: 1.0 s."""
    units = tuple(Layer(name=f"{u}.w", params=125_000, compute_share=0.5, unit=u)
                  for u in "ab")
    w = Workload(name="w", layers=units, batch=8, step_compute_s=0.6)
    net = _ps_net(2, 1e6, 300e3)
    three = predict(w, Setting(strategy="zero", zero_stage=3, workers=2), net)
    assert three.step_s == pytest.approx(0.6 + 0.9, rel=1e-9)
    whole = Workload(name="w", layers=tuple(Layer(name=x.name, params=x.params,
                                                  compute_share=0.5) for x in units),
                     batch=8, step_compute_s=0.6)
    assert predict(whole, Setting(strategy="zero", zero_stage=3, workers=2), net).step_s == \
        pytest.approx(0.6 + 1.5 - 0.2 - 0.3, rel=1e-9)
    # a root unit (the parameters of no unit module) is gathered first and reduced last,
    # both with no compute before them: 2 x 0.25 s more for a third 500 KB
    rooted = Workload(name="w", layers=units + (Layer(name="r", params=125_000,
                                                      compute_share=0.0, unit="root"),),
                      batch=8, step_compute_s=0.6)
    assert [u for u, _, _ in rooted.units()] == ["root", "a", "b"]
    assert predict(rooted, Setting(strategy="zero", zero_stage=3, workers=2), net).step_s \
        == pytest.approx(0.6 + 0.9 + 0.5, rel=1e-9)


def test_averaging_s_buckets_refill_only_in_the_period_s_compute() -> None:
    """Averaging every 8 steps on 2 hosts, 1 MB/s links with a 1 MB bucket, 400 KB of
    parameters, 10 ms of compute: the ring's two half-exchanges move 200 KB each way
    (0.4 s at the rate); the buckets refill only during the 8 steps' 80 ms of compute, so
    the exchange takes 0.32 s, 40 ms a step: 50 ms a step (a full bucket: 10 ms)."""
    grad = 400_000
    layer = Layer(name="l", params=grad // 4, compute_share=1.0)
    w = Workload(name="w", layers=(layer,), batch=32, step_compute_s=0.01)
    p = predict(w, Setting(strategy="average", workers=2, period=8), _ps_net(2, 1e6, 1e6))
    assert p.step_s == pytest.approx(0.01 + (0.4 - 0.08) / 8, rel=1e-9)
