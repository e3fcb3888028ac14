"""What ``--precision bf16`` costs on the GPT against fp32: final test loss over seeds, and
tokens/s, under sync (N = 2, our ring) on the same data, batches and AdamW.

For each seed, an fp32 run and a bf16 run, alternating so that the machine's load falls on
both alike. Reported:

* ``loss_bf16_minus_fp32_seed*`` and their mean: the final test loss's difference (nats),
  beside each run's loss;
* ``bf16_over_fp32_tokens``: the median tokens/s ratio (on a CPU without bf16 matrix units
  bf16 is much slower: it is there for memory and bytes, not speed);
* ``bytes_bf16_over_fp32``: bytes sent, whole run (the fp32 start-up broadcast included).

    python bench/precision.py [--quick]

Sizes: the default GPT (4 blocks, width 128, 4 heads, context 64), batch 16 per rank;
``--quick``: 2 blocks of width 64, 40 steps, seeds 0-2; else 4 x 128, 200 steps.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

from _common import emit

import phalanx


def one(precision: str, seed: int, quick: bool, out: str) -> dict:
    size = {"gpt_layers": 2, "gpt_dim": 64} if quick else {}
    r = phalanx.train("gpt", "shakespeare", strategy="sync", allreduce="ring", workers=2,
                      precision=precision, seed=seed, max_steps=40 if quick else 200,
                      batch_size=16, context=64, rule="adamw", lr=2e-3, eval_every=10**9,
                      test_limit=1000, progress=False, tensorboard=False, out=out,
                      overwrite=True, **size)
    return r.summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 x 64 GPT, 40 steps")
    args = ap.parse_args()
    results: dict = {}
    ratios: dict = {}
    diffs, speed, moved = [], [], []
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-precision-") as tmp:
        for seed in (0, 1, 2):
            runs = {p: one(p, seed, args.quick, f"{tmp}/{p}-{seed}") for p in ("fp32", "bf16")}
            for p, s in runs.items():
                results[f"{p}_seed{seed}"] = {"test_loss": s["test_loss"],
                                              "tokens_per_s": s["tokens_per_s"],
                                              "bytes_sent": s["bytes_sent"]}
                print(f"seed {seed} {p}: test loss {s['test_loss']:.4f}, "
                      f"{s['tokens_per_s']:.0f} tokens/s", file=sys.stderr)
            d = runs["bf16"]["test_loss"] - runs["fp32"]["test_loss"]
            ratios[f"loss_bf16_minus_fp32_seed{seed}"] = round(d, 5)
            diffs.append(d)
            speed.append(runs["bf16"]["tokens_per_s"] / runs["fp32"]["tokens_per_s"])
            moved.append(runs["bf16"]["bytes_sent"] / runs["fp32"]["bytes_sent"])
    ratios["loss_bf16_minus_fp32_mean"] = round(statistics.mean(diffs), 5)
    ratios["bf16_over_fp32_tokens"] = round(statistics.median(speed), 3)
    ratios["bytes_bf16_over_fp32"] = round(statistics.median(moved), 4)
    emit("precision", results, ratios, {})


if __name__ == "__main__":
    main()
