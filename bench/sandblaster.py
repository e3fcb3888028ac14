"""Sandblaster load balancing, in one run (real processes over gloo):

4 workers, 1 shard, LeNet-5, a fixed number of L-BFGS iterations (line search none, so
every run does the same evaluations). Worker 0 is a straggler (``--slow-workers 0:4.0``:
it sleeps 3x its compute time after every portion).

* ``baseline``: no straggler, dynamic portions (8 per worker, backup tasks);
* ``dynamic``: the straggler, dynamic portions with backup tasks;
* ``static``: the straggler, ``--static-portions`` (one fixed portion per worker).

Time = the coordinator's wall time from its start to the last iteration (from the
``lbfgs`` records: process start-up is not counted). Ratios against the baseline measured
in the same run: ``baseline_over_dynamic`` (target >= 1/1.3: the straggler costs at most
30 %) and ``static_over_baseline`` (target >= 2: without load balancing it costs 2x or
more). Medians of repeats.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import _common  # noqa: F401  (puts the repo on sys.path)
import torch

from phalanx.config import RunConfig
from phalanx.entry.api import train

VARIANTS = {
    "baseline": {},
    "dynamic": {"slow_workers": {0: 4.0}},
    "static": {"slow_workers": {0: 4.0}, "static_portions": True},
    "static_baseline": {"static_portions": True},
}


def loop_seconds(run_dir: Path) -> tuple[float, dict]:
    """Wall seconds of the L-BFGS loop and the last iteration's portion counts."""
    records = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines()]
    lbfgs = [r for r in records if r["kind"] == "lbfgs"]
    stats = next(r for r in records if r["kind"] == "sandblaster_stats")
    return lbfgs[-1]["wall_s"], {k: stats[k] for k in ("portions_per_worker", "backups_issued",
                                                      "backups_wasted")}


def one_run(variant: str, iterations: int, model: str, data: str, limit: int) -> tuple:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig(model=model, data=data, strategy="sandblaster", workers=4, servers=1,
                        max_steps=iterations, line_search="none", history=5,
                        train_limit=limit, eval_every=10**9, progress=False,
                        tensorboard=False, out=tmp, **VARIANTS[variant])
        train(config=cfg.validate())
        return loop_seconds(Path(tmp))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer iterations and repeats")
    ap.add_argument("--model", default="lenet5")
    ap.add_argument("--data", default="synthetic")
    ap.add_argument("--train-limit", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    iterations, repeats = (3, 1) if args.quick else (6, 3)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    detail: dict[str, dict] = {}
    for _ in range(repeats):
        for v in VARIANTS:  # interleaved: a load spike hits every variant alike
            seconds, detail[v] = one_run(v, iterations, args.model, args.data, args.train_limit)
            times[v].append(seconds)
    med = {v: _common.median(t) for v, t in times.items()}
    ratios = {
        "baseline_over_dynamic": med["baseline"] / med["dynamic"],
        "static_over_baseline": med["static"] / med["baseline"],
        "dynamic_over_baseline": med["dynamic"] / med["baseline"],
        "static_over_static_baseline": med["static"] / med["static_baseline"],
    }
    _common.emit(
        "sandblaster",
        {"iterations": iterations, "repeats": repeats, "model": args.model, "data": args.data,
         "workers": 4, "slow_workers": "0:4.0", "loop_s": med, "all": times,
         "last_run": detail},
        ratios,
        # dynamic portions + backup tasks: a 4x straggler costs <= 1.3x (1 / 1.3 = 0.77);
        # static partitioning: >= 2x
        {"baseline_over_dynamic": 1 / 1.3, "static_over_baseline": 2.0},
    )


if __name__ == "__main__":
    main()
