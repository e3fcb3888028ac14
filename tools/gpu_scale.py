"""The simulator against real runs at more workers than this machine's 2 cores allow: the
opt-in ``scale`` step of tools/gpu_check.sh (``GPU_CHECK_STEPS=scale``), for the GPU
machine's 16 cores (docs/scale.md, docs/gpu.md).

Here N = 3 processes already share 2 cores, and the model has a rule for that; there every
process has a core of its own up to N = 8 (+ 2 shards), so these points test the model
where nothing is shared. On test hosts (network namespaces, ``tc``: root), CPU only:

1. ``phalanx scale bytes --models mlp,gpt --sizes 8``: every strategy's bytes per step at
   N = 8 (the runs here went to 4), predicted against the kernel's counters;
2. ``phalanx scale steps --models mlp --sizes 2,4,8 --rates 100,20``: step times, each
   strategy's compute fitted at N = 2, 1000 Mbit/s and N = 4 and 8 held out, with this
   checkout's calibration (made on the 2-core machine: its links are tc's, the same).

Writes ``OUT/scale-bytes.md``, ``scale-steps.md`` (and their JSON) and ``scale.json`` (the
figures the summary prints), bytes first: a step cut short by its bound keeps them.

    python3 tools/gpu_scale.py OUT [--dry]

Exit 0 done, 3 when test hosts cannot be made here (the step is skipped, with the reason),
2 for bad input, 1 when a part failed (its one line printed, the other part still runs).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from phalanx.errors import PhalanxError  # noqa: E402
from phalanx.runtime.hosts import unavailable  # noqa: E402

CALIBRATION = "reports/experiments/scale/calibration-cubic.json"
BYTES = {"models": ["mlp", "gpt"], "sizes": [8]}
STEPS = {"models": ["mlp"], "sizes": [2, 4, 8], "rates": [100.0, 20.0], "steps": 12,
         "fit_repeats": 1, "run_s": 1.0}


def bytes_part(out: Path, tmp: Path) -> dict:
    from phalanx.scale import wire_check

    path = wire_check.run(tmp / "bytes", BYTES["models"], BYTES["sizes"])
    shutil.copy(path, out / "scale-bytes.md")
    shutil.copy(path.parent / "bytes.json", out / "scale-bytes.json")
    pts = json.loads((path.parent / "bytes.json").read_text())
    errs = [abs(p["predicted"] / p["measured"] - 1) for p in pts if p["measured"]]
    return {"points": len(errs), "within_2pc": sum(e <= 0.02 for e in errs),
            "median_abs_error": round(statistics.median(errs), 4) if errs else None,
            "worst_abs_error": round(max(errs), 4) if errs else None}


def steps_part(out: Path, tmp: Path) -> dict:
    from phalanx.scale import step_check

    path = step_check.run(tmp / "steps", STEPS["models"], STEPS["sizes"], STEPS["rates"],
                          CALIBRATION, steps=STEPS["steps"], fit_repeats=STEPS["fit_repeats"],
                          run_s=STEPS["run_s"])
    shutil.copy(path, out / "scale-steps.md")
    shutil.copy(path.parent / "steps.json", out / "scale-steps.json")
    pts = json.loads((path.parent / "steps.json").read_text())
    got = {}
    for n in sorted({p["n"] for p in pts if p["held_out"]}):
        errs = [abs(p["predicted_s"] / p["measured_s"] - 1) for p in pts
                if p["held_out"] and p["n"] == n and p["rate"] in STEPS["rates"]]
        if errs:
            got[f"N={n}"] = {"points": len(errs),
                             "median_abs_error": round(statistics.median(errs), 4),
                             "worst_abs_error": round(max(errs), 4)}
    return got


def check(out: Path) -> None:
    """What a dry run can check here: the calibration, the models, the settings."""
    from phalanx.scale import calibrate, step_check, wire_check

    calibrate.load(CALIBRATION)
    for m in BYTES["models"]:
        if m not in wire_check.MODELS:
            raise PhalanxError(f"scale: model {m!r} is not in this checkout")
    for m in STEPS["models"]:
        if m not in step_check.STEP_MODELS:
            raise PhalanxError(f"scale: model {m!r} is not in this checkout")
    if step_check.FIT[0] not in STEPS["sizes"] or max(STEPS["sizes"] + BYTES["sizes"]) > 8:
        raise PhalanxError("scale: sizes must hold N = 2 and go to 8 at most")
    (out / "scale.json").write_text(json.dumps({"dry": True, "bytes": BYTES,
                                                "steps": STEPS}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="folder for scale-*.md / .json and scale.json")
    ap.add_argument("--dry", action="store_true", help="check, run nothing")
    args = ap.parse_args(argv)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"scale: {out}: cannot make the folder ({e.strerror})")
        return 2
    try:
        check(out)
    except (PhalanxError, OSError) as e:
        print(f"scale: {e}")
        return 2
    reason = unavailable()
    if reason is not None:
        print(f"scale: needs test hosts (root, ip, tc): {reason}")
        return 3
    if args.dry:
        print(f"scale: dry run: bytes {BYTES}, steps {STEPS}; test hosts can be made here")
        return 0
    result: dict = {"dry": False}
    bad = 0
    with tempfile.TemporaryDirectory(prefix="gpu-scale-") as tmp:
        for name, part in (("bytes", bytes_part), ("steps", steps_part)):
            t0 = time.monotonic()
            try:
                result[name] = part(out, Path(tmp))
            except Exception as e:  # a part that fails is reported; the other still runs
                first = (str(e).strip().splitlines() or [""])[0]
                result[name] = {"failed": f"{type(e).__name__}: {first}"[:300]}
                bad = 1
            result[name]["seconds"] = round(time.monotonic() - t0, 1)
            print(f"scale: {name}: {json.dumps(result[name])}", flush=True)
            (out / "scale.json").write_text(json.dumps(result, indent=1) + "\n")
    return bad


if __name__ == "__main__":
    sys.exit(main())
