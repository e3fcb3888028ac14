"""The flagship demo: single, sync, ASP and DC-ASGD-a with 4 workers on Fashion-MNIST, one
epoch each, then the comparison table and the report's path (``make demo``)."""

from __future__ import annotations

from pathlib import Path

from phalanx.config import RunConfig
from phalanx.experiments.common import variant
from phalanx.experiments.runs import run_variants, table, write_report

STRATEGIES = ("single", "sync", "asp", "dc-asgd-a")

ASYNC_NOTE = ("Why the division: a gradient applied τ updates after it was computed, under the "
              "server's momentum 0.9, overshoots; on a busy machine a descheduled worker "
              "returns with τ up to 10, and with the full step ASP and DC-ASGD-a sat at "
              "chance (test accuracy 0.10, loss ln 10) for their first evaluations, "
              "measured after 250 server updates. Dividing each step by its staleness "
              "(Zhang et al. 2016, `--staleness-lr`) keeps lr·τ bounded.")


def run_demo(out: Path, *, epochs: float = 1.0, workers: int = 4, data: str = "fashion-mnist",
             model: str = "lenet5", target: float = 0.8) -> tuple[str, Path]:
    base = RunConfig(model=model, data=data, epochs=epochs, batch_size=32, rule="momentum",
                     lr=0.01, workers=workers, servers=1, threads=1, progress=False,
                     out=str(out))
    runs = run_variants([
        variant(base, out, "single", strategy="single", workers=1),
        variant(base, out, "sync", strategy="sync"),
        # staleness-aware learning rate (Zhang et al. 2016) for the asynchronous runs: see
        # ASYNC_NOTE; without it a busy machine leaves them at chance for their first evals
        variant(base, out, "asp", strategy="asp", staleness_lr=True),
        # adaptive delay compensation; lambda_0 = 2 as in Zheng et al. 2017
        variant(base, out, "dc-asgd-a", strategy="dc-asgd", dc_adaptive=True, dc_lambda=2.0,
                staleness_lr=True),
    ])
    pre = (f"LeNet-5 on Fashion-MNIST (60k train / 10k test), {epochs:g} epoch(s), batch 32 "
           f"per worker, momentum SGD (lr 0.01), {workers} worker processes for sync, ASP and "
           f"DC-ASGD-a (1 server shard), one thread per process. Sync averages {workers} "
           f"gradients per step, so it takes {workers}x fewer steps per epoch than single; "
           f"ASP and DC-ASGD-a apply every push at once, with the staleness shown, each "
           f"step divided by its staleness. " + ASYNC_NOTE)
    report = write_report(runs, out, title="phalanx demo: which protocol, at what cost?",
                          target=target, preamble=pre, command="make demo")
    return table(runs, target), report
