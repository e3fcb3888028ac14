"""``phalanx scale steps --across A,B,C``: noise or model? Several reruns of ``phalanx
scale steps`` (each a ``steps.json``), every one predicted again with this model, side by
side: how far each held-out point's measured step moved between reruns, and the model's
error against the median of its measurements. A point whose measurements agree and whose
error is large is the model's to fix; one that moves between reruns is noise no model can
predict (docs/scale.md, "Noise or model?")."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from phalanx.errors import ConfigError
from phalanx.scale import calibrate as cal
from phalanx.scale.report import commit
from phalanx.scale.step_check import Point, load_found, load_parts, points


def across(paths: list[Path], calibration: str, out: Path, cores: int = 0) -> Path:
    """Each file's points predicted again (as ``--reuse`` does); for each held-out point at
    20 and 100 Mbit/s found in all of them, its measured steps, their spread (max / min -
    1) and the error of the prediction against their median: ``across.md``,
    ``across.json`` in ``out``."""
    if len(paths) < 2:
        raise ConfigError("--across: name at least two steps.json files, comma-separated")
    fitted = cal.load(calibration)["fitted"]
    cores = cores or os.cpu_count() or 1
    runs: list[dict[tuple[str, str, int, float], Point]] = []
    for path in paths:
        pts = points(load_found(path), fitted, cores, parts_of=load_parts(path))
        runs.append({(p.model, p.label, p.n, p.rate): p for p in pts
                     if p.held_out and p.rate <= 100})
    keys = sorted(set.intersection(*(set(r) for r in runs)))
    if not keys:
        raise ConfigError("--across: the files share no held-out point at 20 or 100 Mbit/s")
    rows = []
    for k in keys:
        measured = [r[k].measured_s for r in runs]
        predicted = statistics.median(r[k].predicted_s for r in runs)
        rows.append({"model": k[0], "label": k[1], "n": k[2], "rate": k[3],
                     "measured_s": measured, "predicted_s": predicted,
                     "spread": max(measured) / min(measured) - 1,
                     "error": predicted / statistics.median(measured) - 1})
    spread = sorted(r["spread"] for r in rows)
    errs = [abs(r["error"]) for r in rows]
    out.mkdir(parents=True, exist_ok=True)
    (out / "across.json").write_text(json.dumps(
        {"commit": commit(), "calibration": calibration, "files": [str(p) for p in paths],
         "points": rows}, indent=1))

    def ms(v: float) -> str:
        return f"{v * 1e3:.1f}" if v < 0.1 else f"{v * 1e3:.0f}"

    lines = ["# Step times across reruns: noise or model?", "",
             f"Commit {commit()}; calibration {calibration}; each file predicted again with "
             f"this model: {', '.join(str(p) for p in paths)}.", "",
             f"{len(rows)} held-out points at 20 and 100 Mbit/s in all {len(paths)} files. "
             f"Measured step, rerun to rerun (max / min - 1): median "
             f"{statistics.median(spread):.1%}, 90th percentile "
             f"{spread[int(0.9 * (len(spread) - 1))]:.1%}, max {spread[-1]:.1%}. The model "
             f"against each point's median: median {statistics.median(errs):.1%}, worst "
             f"{max(errs):.1%}; beyond 25% / 20% / 10%: "
             + " / ".join(str(sum(e > x for e in errs)) for x in (0.25, 0.20, 0.10)) + ".",
             "", "| model | strategy | N | Mbit/s | measured (ms, each file) | spread | "
             "predicted | error vs median |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['label']} | {r['n']} | {r['rate']:g} | "
              f"{' / '.join(ms(v) for v in r['measured_s'])} | {r['spread']:.0%} | "
              f"{ms(r['predicted_s'])} | {r['error']:+.1%} |"
              for r in sorted(rows, key=lambda r: -abs(r["error"]))]
    path = out / "across.md"
    path.write_text("\n".join(lines) + "\n")
    return path
