"""``make mutate``: mutmut over the numeric core, one module at a time, and its score per
module (killed / mutants that ran; "no tests" and timeouts shown beside it).

Usage: ``python tools/mutate.py [MODULE ...]`` (default: all of MODULES); ``--report``
prints the scores of what has run without running anything. Each mutant runs only the
fast in-process tests that cover its function (pyproject's [tool.mutmut]); the modules
run one after the other, never in parallel with other heavy jobs (2 cores)."""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

MODULES = ["phalanx.comm.compress", "phalanx.comm.exchange", "phalanx.comm.ps_payload",
           "phalanx.comm.allreduce", "phalanx.ps.shard", "phalanx.ps.consistency",
           "phalanx.parallel.ps_worker", "phalanx.parallel.outer_step",
           "phalanx.rules.base", "phalanx.rules.transforms", "phalanx.rules"]
MUTMUT = str(Path(sys.executable).with_name("mutmut"))


def results() -> dict[str, collections.Counter]:
    out = subprocess.run([MUTMUT, "results", "--all", "true"], capture_output=True, text=True,
                         check=True).stdout
    per: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in out.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if "__mutmut_" not in name:
            continue
        module = name.split(".x_")[0].split(".xǁ")[0]
        per[module][status] += 1
    return per


def report(modules: list[str]) -> None:
    per = results()
    print(f"{'module':32} {'mutants':>7} {'killed':>6} {'survived':>8} {'other':>5} score")
    for m in modules:
        c = per.get(m, collections.Counter())
        ran = c["killed"] + c["survived"] + c["timeout"]
        other = sum(c.values()) - c["killed"] - c["survived"]
        score = f"{100 * (c['killed'] + c['timeout']) / ran:.1f}%" if ran else "-"
        print(f"{m:32} {sum(c.values()):7} {c['killed']:6} {c['survived']:8} {other:5} {score}")


def main(argv: list[str]) -> int:
    only_report = "--report" in argv
    modules = [a for a in argv if not a.startswith("--")] or MODULES
    if not only_report:
        for m in modules:
            # "phalanx.rules.*" would also match rules.base: the package's own functions are
            # named phalanx.rules.x_NAME
            pattern = f"{m}.x_*" if m == "phalanx.rules" else f"{m}.*"
            print(f"== mutmut run {pattern}", flush=True)
            subprocess.run([MUTMUT, "run", pattern], check=False,
                           stdout=subprocess.DEVNULL)
    report(modules)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
