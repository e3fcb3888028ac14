"""Claim 1: synchronous data parallel with N workers of batch b is serial SGD with batch N*b.

Exact form: run `--strategy sync` (N real processes), then replay serial SGD in this process
on the very same samples — at step t the union of the N workers' batches, one batch of N*b —
and compare the parameters. The contrast is serial SGD with batch b (worker 0's batches
only), which is what sync is NOT. Context: accuracy curves of sync, single with batch N*b and
single with batch b at equal samples seen.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from phalanx.config import RunConfig
from phalanx.entry.api import make_job, train
from phalanx.experiments.common import base_config, variant, verdict_block
from phalanx.experiments.runs import run_variants, write_report
from phalanx.models.loss import token_cross_entropy
from phalanx.parallel.replicas import worker_batches
from phalanx.rules import apply_updates, make_rule


def serial_replay(cfg: RunConfig, workers: tuple[int, ...], world: int, steps: int
                  ) -> nn.Module:
    """Serial SGD over the batches that ``workers`` of a ``world``-worker sync run take."""

    job = make_job(dataclasses.replace(cfg, strategy="single", workers=1))
    model = job.build_model()
    params = [p for p in model.parameters() if p.requires_grad]
    weights = [p.detach() for p in params]
    rule = make_rule(cfg, steps)
    state = rule.init(weights)
    streams = [worker_batches(job, r, world) for r in workers]
    for _ in range(steps):
        idx = torch.cat([next(s)[1] for s in streams])
        loss = token_cross_entropy(model(job.train.x[idx]), job.train.y[idx])
        grads = torch.autograd.grad(loss, params)
        updates, state = rule.update(list(grads), state, weights)
        apply_updates(weights, updates)
    return model


def max_diff(a: nn.Module, b: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def run(out: Path, *, quick: bool, data: str | None, seed: int) -> Path:
    n, b = 4, 16
    steps = 40 if quick else 300
    base = base_config(out, quick=quick, data=data, seed=seed, batch_size=b, lr=0.1,
                       rule="sgd", tensorboard=False)
    # epochs high enough that max_steps decides: both sides take exactly `steps` steps
    exact_cfg = dataclasses.replace(base, strategy="sync", workers=n, max_steps=steps, epochs=100,
                                    out=str(out / "exact_sync"), eval_every=0).validate()
    exact_cfg.overwrite = True  # the study owns its sub-folders: a rerun replaces them
    synced = train(config=exact_cfg).model
    large = serial_replay(exact_cfg, tuple(range(n)), n, steps)
    small = serial_replay(exact_cfg, (0,), n, steps)
    d_large, d_small = max_diff(synced, large), max_diff(synced, small)

    runs = run_variants([
        variant(base, out, f"sync N={n} b={b}", strategy="sync", workers=n),
        variant(base, out, f"single b={n * b}", strategy="single", batch_size=n * b),
        variant(base, out, f"single b={b}", strategy="single"),
    ])
    measured = (f"after {steps} steps from the same initial weights, max |w_sync - w| over all "
                f"parameters is {d_large:.2e} against serial SGD with batch {n * b} on the same "
                f"samples, and {d_small:.2e} against serial SGD with batch {b}. Final test "
                "accuracy of the full runs at equal samples: " + ", ".join(
                    f"{r.label} {r.summary['test_accuracy']:.4f}" for r in runs) + ".")
    holds = d_large <= 1e-4 and d_small >= 100 * max(d_large, 1e-7)
    pre = verdict_block(f"sync data parallel (N={n} workers, batch {b} each) computes the same "
                        f"updates as serial SGD with batch {n * b} — not serial SGD with batch "
                        f"{b}", measured, holds)
    pre += ("\n\nThe difference to the large batch is float32 rounding: gloo sums the "
            "workers' mean gradients in another order than one mean over the whole batch. "
            "The same equivalence is tested in CI: `tests/unit/test_ps_inproc.py::"
            "test_bsp_equals_large_batch_sgd` (BSP, 1e-6) and `tests/distributed/"
            "test_sync_ddp.py` (sync == PyTorch DDP, 1e-5).")
    return write_report(runs, out, title="Sync data parallel = large-batch serial SGD",
                        target=0.5 if quick else 0.8, preamble=pre,
                        command="phalanx experiments run sync-large-batch"
                        + (" --quick" if quick else ""))
