"""Time to the first training step, from the command's launch (issue 24).

For single, sync N=4, ASP N=4 (1 server) and a 2-stage pipeline: the seconds from starting
``phalanx train`` to the ``unix`` time of the run's first ``train`` event (docs/events.md),
with ranks forked from the pre-loaded fork server (now) and spawned as fresh interpreters
(before), alternated; and the same machine's ``python -c "import torch"`` measured in the
same run, the floor every command pays once. Ratios: each case over ``import torch``.
Target: sync N=4 first step <= 3 s on 2 cores, quiet (the load is reported).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common

CASES = {
    "single": ["--strategy", "single"],
    "sync4": ["--strategy", "sync", "--workers", "4"],
    "asp4": ["--strategy", "asp", "--workers", "4", "--servers", "1"],
    "pipeline2": ["--strategy", "pipeline", "--stages", "2"],
}
COMMON = ["--model", "mlp", "--data", "synthetic", "--max-steps", "2", "--no-progress",
          "--no-tensorboard", "--overwrite"]
# the command, with the rank start method chosen before anything starts
LAUNCH = ("import sys; import phalanx.runtime.supervise as s; s.START_METHOD = sys.argv[1]; "
          "from phalanx.cli import main; sys.exit(main(sys.argv[2:]))")


def first_step_s(method: str, args: list[str], out: Path) -> float:
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", LAUNCH, method, "train", *args, *COMMON,
                        "--out", str(out)], capture_output=True, text=True, cwd=_common.ROOT,
                       timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"startup bench: {method} {' '.join(args)} failed: {r.stderr[-500:]}")
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return min(e["unix"] for e in events if e["kind"] == "train") - t0


def import_torch_s() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="1 repeat (under a minute)")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    reps = 1 if a.quick else a.repeats
    load = os.getloadavg()[0]
    results: dict = {"load_1min_before": round(load, 2)}
    times: dict[str, list[float]] = {"import_torch": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(reps):
            times["import_torch"].append(import_torch_s())
            for case, args in CASES.items():
                for method in ("forkserver", "spawn"):  # alternated: same load for both
                    t = first_step_s(method, args, Path(tmp) / f"{case}-{method}")
                    times.setdefault(f"{case}_{method}", []).append(t)
                    print(f"{case:10s} {method:10s} first step after {t:5.2f} s", flush=True)
    med = {k: round(_common.median(v), 3) for k, v in times.items()}
    results.update(first_step_s=med, load_1min_after=round(os.getloadavg()[0], 2),
                   repeats=reps)
    torch_s = med["import_torch"]
    ratios = {f"{case}_over_import_torch": round(med[f"{case}_forkserver"] / torch_s, 2)
              for case in CASES}
    ratios.update({f"{case}_spawn_over_forkserver":
                   round(med[f"{case}_spawn"] / med[f"{case}_forkserver"], 2) for case in CASES})
    targets = {"sync4_forkserver_first_step_s": "<= 3.0"}
    met = {"sync4_forkserver_first_step_s": med["sync4_forkserver"] <= 3.0}
    print(json.dumps({"bench": "startup", "results": results, "ratios": ratios,
                      "targets": targets, "met": met}))


if __name__ == "__main__":
    main()
