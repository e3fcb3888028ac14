"""How far a reader follows ``opts`` through ``phalanx simulate`` (issue 48): trace the
calls of ``sim/run.py:simulate`` with ``sys.setprofile`` and list every function of
``phalanx/cluster`` that is handed the run's options or one of their sections (an argument
whose class is ``SimulateOptions``, a ``*Options`` dataclass, a ``Cadence`` or an engine's
config), in the order first entered.

    python tools/opts_trace.py [--trace sia:philly:1 --preset sia-artifact --policy sia]
        [--limit 6] [--list]

Prints JSON: ``stops`` (distinct functions handed options), ``files`` (distinct files),
``returns`` (stops in a file already visited, not the one just before), the files entered
most often, and with ``--list`` every stop. ``PYTHONPATH=OTHER_TREE`` measures another
tree with the same definition (the numbers are comparable only between trees measured by
this same script).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path

SECTION_NAMES = ("Options", "Cadence", "IntervalConfig", "SimConfig", "LiveConfig")


def is_options(value: object) -> bool:
    """The run's options or one of their sections (a dataclass named like one)."""
    cls = type(value)
    return dataclasses.is_dataclass(value) and not isinstance(value, type) and (
        cls.__name__ == "SimulateOptions" or cls.__name__.endswith(SECTION_NAMES))


def trace(argv: list[str]) -> dict:
    import phalanx.cluster
    from phalanx.cluster.sim import run as sim_run

    root = str(Path(phalanx.cluster.__file__).parent)
    p = argparse.ArgumentParser()
    p.add_argument("--trace", default="sia:philly:1")
    p.add_argument("--preset", default="sia-artifact")
    p.add_argument("--policy", default="sia")
    p.add_argument("--limit", type=int, default=6)
    p.add_argument("--list", action="store_true")
    args = p.parse_args(argv)
    given = {"trace": args.trace, "ordering": args.policy, "limit": args.limit}
    stops: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()

    def profile(frame, event, _arg) -> None:
        if event != "call":
            return
        code = frame.f_code
        if not code.co_filename.startswith(root):
            return
        n = code.co_argcount + code.co_kwonlyargcount
        names = code.co_varnames[:n]
        if any(is_options(frame.f_locals.get(a)) for a in names):
            key = (str(Path(code.co_filename).relative_to(root)), code.co_qualname)
            if key not in seen:
                seen.add(key)
                stops.append(key)

    sys.setprofile(profile)
    try:
        # the options are built (and each section checked) inside the trace, as the CLI
        # builds them before it calls simulate
        opts = sim_run.SimulateOptions.from_dict(sim_run.apply_preset(args.preset, given))
        sim_run.simulate(opts)
    finally:
        sys.setprofile(None)
    files = [f for f, _ in stops]
    returns = sum(1 for i, f in enumerate(files) if f in files[:i] and f != files[i - 1])
    out = {"stops": len(stops), "files": len(set(files)), "returns": returns,
           "entered": dict(Counter(f for i, f in enumerate(files)
                                   if i == 0 or f != files[i - 1]).most_common(4))}
    if args.list:
        out["list"] = [f"{f}:{q}" for f, q in stops]
    return out


if __name__ == "__main__":
    print(json.dumps(trace(sys.argv[1:]), indent=1))
