"""Zhang et al., "Is Network the Bottleneck of Distributed Training?" (NetAI'20,
arXiv:2006.10103) in the authors' own setting: their simulator's inputs (a V100's measured
batch times and per-tensor backward timelines, ``data/zhang2020.json``), their simulator's
arithmetic (the paper's what-if figures) and our model on the same inputs.
``phalanx.scale.published`` checks one against the other."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from phalanx.scale.network import Link, Links, gbit, uniform_network
from phalanx.scale.predict import predict
from phalanx.scale.setting import Compression, Setting
from phalanx.scale.workload import Layer, Workload

# The paper's what-if figures come from the authors' own simulator (published with it:
# github.com/netx-repo/training-bottleneck, simulation/, Apache-2.0): a V100's measured batch
# time and per-tensor backward timeline for each model, Horovod's fusion (a 5 ms cycle or
# 64 MB), and a flat ring of N GPUs, each at the link's rate, reduce-scatter then all-gather
# of every bucket plus a measured CUDA vector add per reduce-scatter step. Its inputs are
# phalanx/scale/data/zhang2020.json; :func:`zhang_simulator` is its arithmetic (the code
# busy-waits each time; here they are added), the paper's figure. :func:`zhang_efficiency`
# is our model on the same inputs.
ZHANG_MODELS = ("resnet50", "resnet101", "vgg16")
ZHANG_N = 64
ZHANG_CYCLE_MS, ZHANG_CAP = 5.0, 64 * 2 ** 20
ZHANG_ASSUMPTIONS = (
    "the authors' setting (their simulator, netx-repo/training-bottleneck f81b140): 64 V100 "
    "in a flat ring, each at the link's rate; their measured batch times at batch 32 "
    "(ResNet-50 128 ms, ResNet-101 192 ms, VGG-16 (bn) 195 ms) and per-tensor backward "
    "timelines; Horovod's fusion, a 5 ms cycle or 64 MB",
    "their simulator's vector add (~10 us per reduce-scatter step, cuda_vec_add.log) as 5 us "
    "of latency on each of the ring's 2(N-1) steps",
    "'near-linear' read as a scaling factor (efficiency) >= 0.9; compression costs no "
    "compute (as in their simulator)",
)


@functools.lru_cache(maxsize=1)
def _zhang_data() -> dict:
    return json.loads((Path(__file__).parent / "data" / "zhang2020.json").read_text())


def zhang_workload(name: str) -> Workload:
    """The authors' measured model: their backward timeline (tensors in backward order:
    microseconds since the previous gradient, bytes) and batch time, as a workload."""
    d = _zhang_data()
    tensors = list(reversed(d["backward"][name]))  # registration order
    backward = sum(t for t, _ in tensors) / 1e6
    layers = tuple(Layer(name=f"{name}.{i}", params=b // 4, compute_share=t / 1e6 / backward)
                   for i, (t, b) in enumerate(tensors))
    batch_s = d["batch_s"][name]
    return Workload(name=name, layers=layers, batch=32, step_compute_s=batch_s,
                    backward_fraction=backward / batch_s, compute_source="paper",
                    notes="Zhang et al. 2020's measured V100 timeline")


def zhang_simulator(name: str, n: int, rate_gbit: float, ratio: float) -> float:
    """The scaling factor the authors' simulator gives (sim_with_compression_comm.py's
    get_bk_sim_time, its waits added up): batch / (batch + what the ring runs past
    backward)."""
    d = _zhang_data()
    add_x = [float(x) for x, _ in d["vec_add"]]
    add_y = [float(y) for _, y in d["vec_add"]]
    t = ran = 0.0
    held, sends = 0, []
    for wait_us, size in d["backward"][name]:
        t += wait_us / 1e6
        ran += wait_us / 1e6
        held += size
        if ran >= ZHANG_CYCLE_MS / 1e3 or held >= ZHANG_CAP:
            sends.append((t, held))
            ran, held = 0.0, 0
    if held:
        sends.append((t, held))
    end = 0.0
    for ready, size in sends:
        net = size * 8 * (n - 1) / n / (rate_gbit * 1e9) / ratio
        end = max(end, ready) + 2 * net + (n - 1) * float(np.interp(size / n, add_x, add_y))
    batch = d["batch_s"][name]
    return batch / (batch + max(0.0, end - t))


def zhang_efficiency(name: str, rate_gbit: float, ratio: float, n: int = ZHANG_N) -> float:
    """Our model's scaling efficiency in the authors' setting."""
    links = Links(nic=Link(bandwidth=gbit(rate_gbit), latency=5e-6),
                  rack=Link(bandwidth=gbit(rate_gbit) * 64, latency=0.0))
    net = uniform_network(n, gpus_per_server=1, servers_per_rack=n, links=links)
    s = Setting(strategy="sync", workers=n, bucket_mb=ZHANG_CAP / 1e6,
                fusion_cycle_ms=ZHANG_CYCLE_MS, compress=Compression.parse(f"ratio:{ratio:g}"))
    return predict(zhang_workload(name), s, net).efficiency


ZHANG_RATIOS = (1, 1.5, 2, 3, 4, 5, 6, 8, 10, 20, 50, 100)


def needed(efficiency: Callable[[float], float]) -> float:
    """The smallest compression ratio of :data:`ZHANG_RATIOS` at which ``efficiency`` reaches
    0.9 ('near-linear'); 1000 where none does."""
    return float(next((r for r in ZHANG_RATIOS if efficiency(r) >= 0.9), 1000))
