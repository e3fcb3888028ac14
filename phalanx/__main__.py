"""``python -m phalanx ...``: the same command as ``phalanx`` (``phalanx.cli``)."""

import sys

from phalanx.cli import main

sys.exit(main())
