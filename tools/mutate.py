"""``make mutate``: mutmut over the numeric core, one module at a time, and its score per
module (killed / mutants that ran; "no tests" and timeouts shown beside it).

Usage: ``python tools/mutate.py [--sample K] [MODULE ...]`` (default: all of MODULES);
``--sample K`` runs every K-th mutant of each module (sorted by name) instead of all of them;
``--survivors`` re-runs only the mutants of each module that survived or had no tests
(after tests were added); ``--report`` prints the scores of what has run without running
anything. The score counts
the mutants that ran ("not checked" ones, left out by a sample, are not in it; "no tests"
ones count as not killed). Each mutant runs only the fast in-process tests that cover its
function (pyproject's [tool.mutmut]); the modules run one after the other, never in
parallel with other heavy jobs (2 cores)."""

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


def statuses() -> dict[str, str]:
    """Every mutant's name -> its status (killed, survived, no tests, not checked, ...)."""
    out = subprocess.run([MUTMUT, "results", "--all", "true"], capture_output=True, text=True,
                         check=True).stdout
    found = {}
    for line in out.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if "__mutmut_" in name:
            found[name] = status
    return found


def module_of(name: str) -> str:
    return name.split(".x_")[0].split(".xǁ")[0]


def results() -> dict[str, collections.Counter]:
    per: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for name, status in statuses().items():
        per[module_of(name)][status] += 1
    return per


def report(modules: list[str]) -> None:
    per = results()
    print(f"{'module':30} {'mutants':>7} {'ran':>5} {'killed':>6} {'timeout':>7} "
          f"{'survived':>8} {'no tests':>8} score")
    for m in modules:
        c = per.get(m, collections.Counter())
        ran = sum(c.values()) - c["not checked"]
        dead = c["killed"] + c["timeout"]
        score = f"{100 * dead / ran:.1f}%" if ran else "-"
        print(f"{m:30} {sum(c.values()):7} {ran:5} {c['killed']:6} {c['timeout']:7} "
              f"{c['survived']:8} {c['no tests']:8} {score}")


def main(argv: list[str]) -> int:
    only_report = "--report" in argv
    sample = int(argv[argv.index("--sample") + 1]) if "--sample" in argv else 1
    skip = {argv.index("--sample") + 1} if "--sample" in argv else set()
    modules = [a for i, a in enumerate(argv) if not a.startswith("--") and i not in skip]
    modules = modules or MODULES
    if not only_report:
        for m in modules:
            if "--survivors" in argv:
                names = sorted(n for n, st in statuses().items()
                               if module_of(n) == m and st in ("survived", "no tests"))
                if not names:
                    continue
            elif sample > 1:
                names = sorted(n for n in statuses() if module_of(n) == m)[::sample]
            else:
                # "phalanx.rules.*" would also match rules.base: the package's own
                # functions are named phalanx.rules.x_NAME
                names = [f"{m}.x_*" if m == "phalanx.rules" else f"{m}.*"]
            what = ("survivors" if "--survivors" in argv else
                    "all" if sample == 1 else f"every {sample}th")
            print(f"== mutmut run {m} ({what}: {len(names)} names)", flush=True)
            subprocess.run([MUTMUT, "run", *names], check=False, stdout=subprocess.DEVNULL)
    report(modules)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
