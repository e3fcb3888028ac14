"""GPU throughput: our single-GPU loop against a plain PyTorch GPU loop with the same data
placement (the training set resident on the GPU, batches indexed there), LeNet-5, batch
64, momentum; then sync and ASP with N = 2 and 4 ranks sharing the one GPU, against our
single-GPU loop. Steady state: the first WARMUP steps are not timed.

    python bench/gpu.py [--quick]

Target: ours / plain >= 0.95. Without CUDA it prints its JSON line with empty results and
a "skipped: CUDA not available" note, and exits 0.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (puts the repo on sys.path)
import torch
from scaling import WARMUP, steady_rate
from torch import nn

from phalanx.config import RunConfig
from phalanx.data import epoch_batches, load_data
from phalanx.entry.api import train
from phalanx.models import build_model

BATCH = 64


def plain_loop(data, steps: int) -> float:
    """The loop a PyTorch user writes: data on the GPU, SGD with momentum."""
    dev = torch.device("cuda")
    train_set, _ = data
    torch.manual_seed(0)
    model = build_model("lenet5", train_set.input_shape, train_set.num_classes).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x_all, y_all = train_set.x.to(dev), train_set.y.to(dev)
    shard = torch.arange(len(train_set))
    step, epoch, t0 = 0, 0, 0.0
    while step < steps:
        for idx in epoch_batches(shard, BATCH, epoch, 0):
            idx = idx.to(dev)
            loss = loss_fn(model(x_all[idx]), y_all[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if step == WARMUP:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            if step == steps:
                break
        epoch += 1
    torch.cuda.synchronize()
    return (steps - WARMUP) * BATCH / (time.perf_counter() - t0)


def ours(data, steps: int, strategy: str = "single", workers: int = 1) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig(model="lenet5", data="synthetic", strategy=strategy, workers=workers,
                        servers=1, batch_size=BATCH, rule="momentum", lr=0.01,
                        max_steps=steps, epochs=1000.0, eval_every=10**9, progress=False,
                        tensorboard=False, test_limit=100, device="cuda", out=tmp)
        train("lenet5", data, config=cfg.validate())
        return steady_rate(Path(tmp))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        _common.emit("gpu", {"note": "skipped: CUDA not available"}, {}, {})
        return
    steps, repeats = (200, 1) if args.quick else (1000, 3)
    data = load_data("synthetic" if args.quick else "fashion-mnist", None, 0)
    plain, single = [], []
    for _ in range(repeats):  # alternate, medians: the GPU clocks and the host are shared
        plain.append(plain_loop(data, steps))
        single.append(ours(data, steps))
    m_plain, m_single = _common.median(plain), _common.median(single)
    rates = {"plain": m_plain, "single": m_single}
    ratios = {"single_over_plain": m_single / m_plain}
    for strategy in ("sync", "asp"):
        for n in (2, 4):
            rate = ours(data, steps // 2, strategy, n)
            rates[f"{strategy}{n}"] = rate
            ratios[f"{strategy}{n}_over_single"] = rate / m_single
    _common.emit("gpu", {"device": torch.cuda.get_device_name(0), "steps": steps,
                         "samples_per_s": rates, "all": {"plain": plain, "single": single}},
                 ratios, {"single_over_plain": 0.95})


if __name__ == "__main__":
    main()
