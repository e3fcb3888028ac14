"""Claim 1: synchronous data parallel with N workers of batch b is serial SGD with batch N*b.

Runs sync (N workers, batch b), single with batch N*b and, as the contrast, single with
batch b, all at the same learning rate; compares test accuracy at equal samples seen.
"""

from __future__ import annotations

from pathlib import Path

from phalanx.experiments.common import base_config, variant, verdict_block
from phalanx.experiments.compare import run_variants, write_report


def run(out: Path, *, quick: bool, data: str | None, seed: int) -> Path:
    n, b = 4, 16
    base = base_config(out, quick=quick, data=data, seed=seed, batch_size=b, lr=0.1,
                       rule="sgd", eval_every=0)
    # one evaluation per epoch in every run, so the runs are compared at equal samples seen
    runs = run_variants([
        variant(base, out, f"sync N={n} b={b}", strategy="sync", workers=n),
        variant(base, out, f"single b={n * b}", strategy="single", batch_size=n * b),
        variant(base, out, f"single b={b}", strategy="single"),
    ])
    sync, large, small = runs

    def gap(a, c) -> float:
        # mean |accuracy difference| over the evaluation points both runs share
        pairs = list(zip(a.evals, c.evals))
        return sum(abs(x["test_accuracy"] - y["test_accuracy"]) for x, y in pairs) / len(pairs)

    g_large, g_small = gap(sync, large), gap(sync, small)
    measured = (f"mean |test-accuracy gap| per epoch: sync vs single b={n * b}: {g_large:.4f}; "
                f"sync vs single b={b}: {g_small:.4f}. Final accuracy: sync "
                f"{sync.summary['test_accuracy']:.4f}, large batch "
                f"{large.summary['test_accuracy']:.4f}, small batch "
                f"{small.summary['test_accuracy']:.4f}. Steps: sync {sync.summary['steps']}, "
                f"large batch {large.summary['steps']}, small batch {small.summary['steps']}.")
    pre = verdict_block(f"sync data parallel (N={n}, b={b}) follows serial SGD with batch "
                        f"{n * b}, not serial SGD with batch {b}", measured, g_large < g_small)
    pre += ("\n\nThe exact form of the claim (identical parameters when both see the same "
            "samples) is tested: `tests/unit/test_ps_inproc.py::test_bsp_equals_large_batch_sgd` "
            "(BSP == batch N*b to 1e-6) and `tests/distributed/test_sync_ddp.py` (sync == "
            "PyTorch DDP to 1e-5).")
    return write_report(runs, out, title="Sync data parallel = large-batch serial SGD",
                        target=0.8 if not quick else 0.5, preamble=pre,
                        command=f"phalanx experiments run sync-large-batch"
                                f"{' --quick' if quick else ''}")
