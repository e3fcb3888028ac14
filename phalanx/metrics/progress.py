"""Progress output: a redrawn bar on a terminal, plain lines (every ~5 s) otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, label: str = "train", stream: TextIO | None = None,
                 enabled: bool = True, every_s: float = 5.0) -> None:
        self.total, self.label = max(total, 1), label
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.every_s = every_s
        self._t0 = self._last = time.perf_counter()
        self._shown = False

    def update(self, done: int, **info: float) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        interval = 0.2 if self.tty else self.every_s
        if now - self._last < interval and done < self.total:
            return
        self._last = now
        frac = min(done / self.total, 1.0)
        extras = " ".join(f"{k}={v:.4g}" for k, v in info.items())
        elapsed = now - self._t0
        if self.tty:
            bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
            self.stream.write(
                f"\r{self.label} [{bar}] {done}/{self.total} {elapsed:5.1f}s {extras}")
            self._shown = True
        else:
            self.stream.write(f"{self.label} {done}/{self.total} ({100 * frac:.0f}%) "
                              f"{elapsed:.1f}s {extras}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self._shown:
            self.stream.write("\n")
            self.stream.flush()
