"""Bytes on the wire, counted by the kernel: 4 test hosts x 1 process, so every byte a rank
sends crosses its host's eth0. ``phalanx.experiments.hostgroup`` reads
``/sys/class/net/eth0/statistics`` in each host right before and after each run (behind
barriers).

* ring allreduce: each host sends 2X(N-1)/N per step, as phalanx's own counter says;
* main node: the root carries 2X(N-1) per step (sends X to and receives X from each other
  rank), every other host sends X.

X = the model's bytes (fp32). Both counters include the start-up broadcast of rank 0's
weights (gloo's is a binomial tree: rank 0 sends log2(N) copies, rank 1 one), and the kernel
also counts TCP/IP headers (GSO frames on veth: < 1%) and the store's few messages. 40 steps
of a 0.4 MB model keep those within a few percent.
"""

from __future__ import annotations

import json

import pytest
from common import BASE, run_group

from phalanx.runtime.checkpoint import load_checkpoint
from phalanx.runtime.hosts import TestNetwork, unavailable

N, STEPS = 4, 40
RUNS = {f"sync-{a}": {**BASE, "max_steps": STEPS, "train_limit": 3200, "strategy": "sync",
                      "allreduce": a,
                      "workers": N, "checkpoint_every": 0} for a in ("ring", "main")}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no test hosts: {reason}")
    out = tmp_path_factory.mktemp("bytes")
    with TestNetwork(N) as net:
        run_group(net, 1, RUNS, out, netstats="eth0")
    model = load_checkpoint(out / "sync-ring" / "final_model.pt")["model"]
    x = sum(t.numel() * t.element_size() for t in model.values())
    result = {}
    for name in RUNS:
        events = [json.loads(ln) for ln in (out / name / "events.jsonl").read_text().splitlines()]
        ours = {e["rank"]: e["bytes_sent"] for e in events
                if e["kind"] == "train" and e["step"] == STEPS}
        kernel = {r: json.loads((out / name / f"netstats-rank{r}.json").read_text())
                  for r in range(N)}
        result[name] = ours, kernel
    return x, result


def test_ring_per_host_matches_our_counter_and_the_formula(measured) -> None:
    x, result = measured
    ours, kernel = result["sync-ring"]
    formula = STEPS * 2 * x * (N - 1) / N
    for r in range(N):
        tx = kernel[r]["tx_bytes"]
        print(f"ring rank {r}: kernel tx {tx:,}  phalanx {ours[r]:,}  2X(N-1)/N x steps "
              f"{formula:,.0f}  kernel/phalanx {tx / ours[r]:.3f}  kernel/formula "
              f"{tx / formula:.3f}")
        assert abs(tx / ours[r] - 1) <= 0.10
        assert abs(tx / formula - 1) <= 0.10


def test_each_host_s_counters_name_its_packets_mtu_retransmissions_and_seconds(measured):
    """What ``phalanx scale bytes`` takes a host's retransmissions off with: the segments
    it sent again (never more than it sent), its link's MTU (veth: 1,500), its packets
    (a 0.4 MB step is several full frames: at least tx_bytes / (MTU + 14) of them, GSO's
    larger frames aside, or one packet per 64 KB) and the run's seconds."""
    _, result = measured
    for name in RUNS:
        for r, k in result[name][1].items():
            assert k["mtu"] == 1500, (name, r, k)
            assert 0 <= k["retrans_segs"] < k["tx_packets"], (name, r, k)
            assert k["tx_packets"] >= k["tx_bytes"] / 65_536, (name, r, k)
            assert k["rx_packets"] > 0 and 0 < k["seconds"] < 120, (name, r, k)


def test_main_node_root_carries_2x_n_minus_1(measured) -> None:
    x, result = measured
    ours, kernel = result["sync-main"]
    root = kernel[0]["tx_bytes"] + kernel[0]["rx_bytes"]
    formula = STEPS * 2 * x * (N - 1)
    print(f"main node root: kernel tx+rx {root:,}  2X(N-1) x steps {formula:,.0f}  "
          f"ratio {root / formula:.3f}; phalanx counted {ours[0]:,} sent")
    assert abs(root / formula - 1) <= 0.10
    assert abs(kernel[0]["tx_bytes"] / ours[0] - 1) <= 0.10
    for r in range(1, N):  # every other host sends X per step
        tx = kernel[r]["tx_bytes"]
        print(f"main node rank {r}: kernel tx {tx:,}  X x steps {STEPS * x:,}")
        assert abs(tx / (STEPS * x) - 1) <= 0.10
        assert abs(tx / ours[r] - 1) <= 0.10
    # the root moves N-1 times what a ring host does: the seeds' claim, on the wire
    ring_tx = result["sync-ring"][1][1]["tx_bytes"]
    assert kernel[0]["tx_bytes"] > 1.8 * ring_tx
