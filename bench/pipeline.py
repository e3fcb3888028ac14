"""Pipeline bubble and activation memory, measured: GPipe vs 1F1B on real processes.

For P = 2 and 4 stages and M micro-batches in 1..16, every stage runs the real
``torch.distributed.pipelining`` schedule (through phalanx's ``build_schedule``) over a
model of P equal blocks, one per stage. Per stage we measure

* idle fraction = 1 - compute / wall, where *compute* is the time spent inside the
  stage's per-micro-batch forward and backward (``MeteredStage``) and *wall* the time of
  the whole step on that stage; everything else is the stage waiting in recv for a
  neighbour (plus its sends) -- the bubble. Compared with the theory (P-1)/(M+P-1).
* peak live micro-batches (forwarded, not yet backwarded) and peak bytes autograd held
  saved for backward (counted by ``saved_tensors_hooks`` as tensors are saved / freed).

Work per block: ``--work sleep`` (default) is a calibrated sleep inside forward (1x) and
backward (2x) proportional to the micro-batch size, like an accelerator kernel that frees
the host CPU: P = 4 processes then do not fight over the 2 shared cores. ``--work compute``
is real matrix multiplies (oversubscribed when P exceeds the free cores: reported too).

    python bench/pipeline.py [--quick] [--work sleep|compute|both]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from phalanx.parallel.instrument import StageMeter  # noqa: E402
from phalanx.parallel.pipeline import build_schedule, pipeline_step  # noqa: E402
from phalanx.runtime.launch import spawn  # noqa: E402

BATCH = 48  # divisible by every M below, so micro-batches are equal
DIM = 256
CLASSES = 10


class _Sleep(torch.autograd.Function):
    """Identity that takes ``seconds`` forward and twice that backward."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        time.sleep(seconds)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(2 * ctx.seconds)
        return grad, None


class Block(nn.Module):
    """One stage's work: Linear + tanh, plus ``per_sample_s`` of sleep (sleep mode) or
    ``depth`` extra Linear layers (compute mode)."""

    def __init__(self, work: str, per_sample_s: float, depth: int, head: bool) -> None:
        super().__init__()
        self.work, self.per_sample_s = work, per_sample_s
        self.layers = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(depth))
        self.head = nn.Linear(DIM, CLASSES) if head else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        if self.work == "sleep":
            x = _Sleep.apply(x, self.per_sample_s * x.shape[0])
        return self.head(x) if self.head is not None else x


def _counts(schedule: str, micro_counts: list[int], stages: int) -> list[int]:
    # torch's 1F1B needs M >= P (with fewer it would be GPipe anyway)
    return [m for m in micro_counts if schedule == "gpipe" or m >= stages]


def _measure(rank: int, world: int, work: str, per_sample_s: float, depth: int,
             micro_counts: list[int], steps: int, out: str) -> None:
    rows = []
    torch.manual_seed(0)
    x = torch.randn(BATCH, DIM)
    y = torch.randint(0, CLASSES, (BATCH,))
    for name in ("gpipe", "1f1b"):
        for m in _counts(name, micro_counts, world):
            torch.manual_seed(0)
            block = Block(work, per_sample_s, depth, head=rank == world - 1)
            mb = BATCH // m
            shapes = [(mb, DIM)] * (world - 1) + [(mb, CLASSES)]
            meter = StageMeter(block)
            schedule = build_schedule(block, meter, rank, world, shapes, (DIM,), name, m)
            per_step = []
            for i in range(steps + 1):
                dist.barrier()  # all stages start the step together
                c0, t0 = meter.compute_s, time.perf_counter()
                with meter.saving():
                    pipeline_step(schedule, rank, world, x if rank == 0 else None, y, [])
                wall = time.perf_counter() - t0
                for p in block.parameters():
                    p.grad = None
                if i:  # step 0 connects the peers and warms up: not measured
                    per_step.append([meter.compute_s - c0, wall])
            rows.append([per_step, meter.peak_live, meter.peak_bytes])
    timing = torch.tensor([r[0] for r in rows], dtype=torch.float64)  # (case, step, 2)
    peaks = torch.tensor([r[1:] for r in rows], dtype=torch.float64)  # (case, 2)
    all_timing = [torch.zeros_like(timing) for _ in range(world)]
    all_peaks = [torch.zeros_like(peaks) for _ in range(world)]
    dist.all_gather(all_timing, timing)
    dist.all_gather(all_peaks, peaks)
    if rank == 0:
        torch.save({"timing": torch.stack(all_timing), "peaks": torch.stack(all_peaks)}, out)


def run_case(work: str, stages: int, micro_counts: list[int], per_sample_s: float, depth: int,
             steps: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "rows.pt")
        spawn(_measure, stages, (work, per_sample_s, depth, micro_counts, steps, out))
        data = torch.load(out, weights_only=True)
    timing, peaks = data["timing"], data["peaks"]  # (stage, case, step, 2), (stage, case, 2)
    results, case = [], 0
    for name in ("gpipe", "1f1b"):
        for m in _counts(name, micro_counts, stages):
            compute, wall = timing[:, case, :, 0], timing[:, case, :, 1]
            # the step lasts until its slowest stage finishes (all started at a barrier);
            # a stage is idle for whatever part of that it did not compute
            step_wall = wall.max(0).values  # (step,)
            idle = (1 - compute / step_wall).median(1).values  # (stage,)
            results.append({
                "work": work, "P": stages, "M": m, "schedule": name,
                "idle_measured": round(idle.mean().item(), 4),
                "idle_per_stage": [round(v, 4) for v in idle.tolist()],
                "bubble_theory": round((stages - 1) / (m + stages - 1), 4),
                "step_s": round(step_wall.median().item(), 5),
                "compute_s_per_stage": [round(v, 5) for v in compute.median(1).values.tolist()],
                "peak_live_microbatches": [int(v) for v in peaks[:, case, 0].tolist()],
                "peak_saved_bytes": [int(v) for v in peaks[:, case, 1].tolist()],
            })
            case += 1
    return results


def _find(rows, **key):
    return next(r for r in rows if all(r[k] == v for k, v in key.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer M values and steps (< 1 min)")
    ap.add_argument("--work", choices=("sleep", "compute", "both"), default=None,
                    help="default: both, or sleep with --quick")
    args = ap.parse_args()
    micro = [1, 2, 4, 8] if args.quick else [1, 2, 3, 4, 6, 8, 12, 16]
    steps = 2 if args.quick else 4
    # work per sample per stage (forward; backward twice that): large enough that the
    # per-micro-batch overhead of the schedule and of waking a process stays small
    per_sample_s = 0.001 if args.quick else 0.002
    rows: list[dict] = []
    work_arg = args.work or ("sleep" if args.quick else "both")
    works = ("sleep", "compute") if work_arg == "both" else (work_arg,)
    for work in works:
        for stages in (2, 4):
            depth = 1 if work == "sleep" else 24  # compute: ~30 ms of matmuls per stage-step
            rows += run_case(work, stages, micro, per_sample_s, depth, steps)
            for r in [r for r in rows if r['work'] == work and r['P'] == stages]:
                print(f"{r['work']:7s} P={r['P']} M={r['M']:2d} {r['schedule']:5s} "
                      f"idle {r['idle_measured']:.3f} (theory {r['bubble_theory']:.3f}) "
                      f"step {1000 * r['step_s']:.1f} ms peak live {r['peak_live_microbatches']}"
                      f" bytes {r['peak_saved_bytes']}", file=sys.stderr)
    ref = "sleep" if "sleep" in works else "compute"
    p4 = 4 if any(r["P"] == 4 and r["work"] == ref for r in rows) else 2
    g1 = _find(rows, work=ref, P=p4, M=1, schedule="gpipe")
    g8 = _find(rows, work=ref, P=p4, M=8, schedule="gpipe")
    f8 = _find(rows, work=ref, P=p4, M=8, schedule="1f1b")
    mean = statistics.mean
    ratios = {
        # pipelining's point: M=8 micro-batches vs none (plain model parallelism), measured
        f"speedup_{ref}_P{p4}_M8_over_M1": g1["step_s"] / g8["step_s"],
        # how close the measured bubble is to (P-1)/(M+P-1) (1.0 = exactly the theory)
        f"bubble_theory_over_measured_{ref}_P{p4}_M8": g8["bubble_theory"] / g8["idle_measured"],
        # activation memory GPipe holds over what 1F1B holds (mean over stages)
        f"gpipe_over_1f1b_saved_bytes_{ref}_P{p4}_M8":
            mean(g8["peak_saved_bytes"]) / mean(f8["peak_saved_bytes"]),
    }
    theory_speedup = p4 * 8 / (8 + p4 - 1)
    targets = {
        f"speedup_{ref}_P{p4}_M8_over_M1": round(0.7 * theory_speedup, 3),
        f"bubble_theory_over_measured_{ref}_P{p4}_M8": 0.7,
        f"gpipe_over_1f1b_saved_bytes_{ref}_P{p4}_M8": 1.5,
    }
    print(json.dumps({"bench": "pipeline", "results": {"rows": rows, "batch": BATCH,
                                                       "per_sample_s": per_sample_s},
                      "ratios": {k: round(v, 3) for k, v in ratios.items()},
                      "targets": targets}))


if __name__ == "__main__":
    main()
