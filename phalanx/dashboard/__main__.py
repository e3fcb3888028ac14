"""``python -m phalanx.dashboard DIR``: the dashboard without the rest of the ``phalanx``
command (which imports torch first: ~3 s before ``--help``)."""

from __future__ import annotations

import argparse
import sys

from phalanx.dashboard.cli import add_flags
from phalanx.errors import PhalanxError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m phalanx.dashboard",
                                     description="a read-only web page over a folder of runs "
                                                 "and schedules (docs/dashboard.md)")
    add_flags(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return int(args.func(args) or 0)
    except PhalanxError as e:
        sys.stderr.write(f"phalanx: error: {str(e).splitlines()[0]}\n")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
