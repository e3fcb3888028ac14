"""Intra-op threads on a busy machine: phalanx's ``OMP_WAIT_POLICY=PASSIVE`` (set by
``import phalanx``, phalanx/__init__.py) against torch's default, where libgomp's idle
threads spin before they sleep.

One process trains a small transformer-shaped model (1,024 tokens x width 128, 4 blocks of
attention-free linear + GELU + linear, AdamW) with 2 intra-op threads, plain PyTorch (no
phalanx import: the reference is what a user's script gets), for a fixed wall time after a
warm-up, and reports steps/s. It runs without and beside one busy-loop process per core (a
machine shared by other jobs, or by more ranks than cores), each policy in alternation,
medians over rounds. Ratios: passive over the default, loaded and quiet.

    .venv/bin/python bench/threads.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys

CHILD = r"""
import time, torch
torch.set_num_threads(2)
torch.manual_seed(0)
layers = []
for _ in range(4):
    layers += [torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 128)]
model = torch.nn.Sequential(*layers)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(1024, 128)
def step():
    opt.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    opt.step()
for _ in range(2):
    step()
end, steps, t0 = time.perf_counter() + SECONDS, 0, time.perf_counter()
while time.perf_counter() < end:
    step()
    steps += 1
print(steps / (time.perf_counter() - t0))
"""


def _burn() -> None:
    while True:
        pass


def steps_per_s(policy: str | None, seconds: float) -> float:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    r = subprocess.run([sys.executable, "-c", CHILD.replace("SECONDS", str(seconds))],
                       env=env, capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise SystemExit(f"threads bench: the child failed: {r.stderr.strip()[-300:]}")
    return float(r.stdout.strip().splitlines()[-1])


def measure(rounds: int, seconds: float, burners: int) -> dict[str, float]:
    procs = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(burners)]
    for p in procs:
        p.start()
    try:
        got: dict[str, list[float]] = {"passive": [], "default": []}
        for _ in range(rounds):
            got["passive"].append(steps_per_s("PASSIVE", seconds))
            got["default"].append(steps_per_s(None, seconds))
        return {k: statistics.median(v) for k, v in got.items()}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 round of 3 s each (~40 s)")
    args = ap.parse_args()
    rounds, seconds = (1, 3.0) if args.quick else (3, 10.0)
    cores = os.cpu_count() or 1
    load_before = os.getloadavg()[0]
    quiet = measure(rounds, seconds, 0)
    loaded = measure(rounds, seconds, cores)
    ratios = {"passive_over_default_loaded": round(loaded["passive"] / loaded["default"], 2),
              "passive_over_default_quiet": round(quiet["passive"] / quiet["default"], 2)}
    targets = {"passive_over_default_loaded": ">= 1.5", "passive_over_default_quiet": ">= 0.9"}
    met = {"passive_over_default_loaded": ratios["passive_over_default_loaded"] >= 1.5,
           "passive_over_default_quiet": ratios["passive_over_default_quiet"] >= 0.9}
    print(f"steps/s, 2 intra-op threads: quiet passive {quiet['passive']:.2f} default "
          f"{quiet['default']:.2f}; beside {cores} busy loops passive {loaded['passive']:.2f} "
          f"default {loaded['default']:.2f} (1-minute load before: {load_before:.2f}; 'quiet' "
          "is without our busy loops, whatever else runs)",
          file=sys.stderr)
    print(json.dumps({"bench": "threads", "results": {
        "quiet_passive_steps_per_s": round(quiet["passive"], 3),
        "quiet_default_steps_per_s": round(quiet["default"], 3),
        "loaded_passive_steps_per_s": round(loaded["passive"], 3),
        "loaded_default_steps_per_s": round(loaded["default"], 3),
        "busy_loops": cores, "rounds": rounds, "seconds": seconds,
        "load_1min_before": round(load_before, 2)},
        "ratios": ratios, "targets": targets, "met": met}))


if __name__ == "__main__":
    main()
