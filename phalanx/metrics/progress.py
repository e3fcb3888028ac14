"""Progress output: a tqdm bar on a terminal, a plain line every few seconds otherwise.

tqdm rather than rich: the bar is drawn by one rank of a multi-process run, a child
process writing to an inherited stderr, and tqdm draws from the calling thread with no
live-render thread to start, flush or stop around fork/exec; it imports in ~30 ms. On a
pipe (CI, ``| tee``) tqdm's carriage returns would pile up, so there the plain line stays.

Both show what users of tqdm, torchrun and Ray Train expect: steps done of total, the
rate (samples/s when the caller passes samples, steps/s otherwise), the ETA, and the
caller's latest figures (epoch, loss, accuracy, ...).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import TextIO


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def _fmt(key: str, value: float | int | str) -> str:
    if isinstance(value, str):
        return f"{key} {value}"
    if isinstance(value, int) or float(value).is_integer() and key in ("epoch", "iteration"):
        return f"{key} {int(value)}"
    return f"{key} {value:.4g}"


class Progress:
    def __init__(self, total: int, label: str = "train", stream: TextIO | None = None,
                 enabled: bool = True, every_s: float = 5.0, unit: str = "step",
                 tokens_per_sample: int = 0) -> None:
        """``tokens_per_sample`` > 0: a language model's windows; tokens/s is shown too."""
        self.total, self.label, self.unit = max(total, 1), label, unit
        self.tokens_per_sample = tokens_per_sample
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and _terminal(self.stream)
        self.every_s = every_s
        self._t0 = self._last = time.perf_counter()
        self._done = 0
        self._samples: tuple[float, float] | None = None  # (time, samples) at the start
        self._rate = ""
        self.info: dict[str, float | int | str] = {}
        self._bar = None  # drawn at the first update: other ranks' start-up lines come first

    def _draw(self):
        if self._bar is None:
            from tqdm import tqdm  # only where a bar is drawn

            # tqdm's default lock is a multiprocessing RLock: a named semaphore that a rank
            # leaving by os._exit never releases (resource_tracker warned of a leak at the
            # driver's exit). One bar per process: a thread lock is all it needs.
            tqdm.set_lock(threading.RLock())

            self._bar = tqdm(total=self.total, desc=self.label, unit=self.unit,
                             file=self.stream, dynamic_ncols=True, mininterval=0.2,
                             leave=True, bar_format="{desc} {bar} {n_fmt}/{total_fmt} "
                                                    "[{elapsed}<{remaining}]{postfix}")
        return self._bar

    def update(self, done: int, *, samples: float | None = None,
               **info: float | int | str) -> None:
        """``done`` steps of ``total``; ``samples`` so far (for samples/s); ``info``: the
        latest figures to show (kept until replaced)."""
        if not self.enabled:
            return
        self.info.update(info)
        now = time.perf_counter()
        if samples is not None:
            if self._samples is None:
                self._samples = (now, samples)  # the rate counts from the first update
            elif now > self._samples[0]:
                rate = (samples - self._samples[1]) / (now - self._samples[0])
                self._rate = f"{rate:,.0f} samples/s"
                if self.tokens_per_sample:
                    self._rate += f", {rate * self.tokens_per_sample:,.0f} tokens/s"
        if self.tty:
            bar = self._draw()
            bar.set_postfix_str("  ".join(self._figures()), refresh=False)
            bar.update(max(done - self._done, 0))
            self._done = done
            return
        self._done = done
        if now - self._last < self.every_s and done < self.total:
            return
        self._last = now
        self.stream.write(self.line(now) + "\n")
        self.stream.flush()

    def _figures(self) -> list[str]:
        """The rate and the caller's latest figures, each as "name value"."""
        return ([self._rate] if self._rate else []) + [_fmt(k, v) for k, v in self.info.items()]

    def line(self, now: float | None = None) -> str:
        """The plain line: ``label 180/937 (19%) 0:12 elapsed, ETA 0:51, 2,790 samples/s,
        epoch 1, loss 0.6561``."""
        now = time.perf_counter() if now is None else now
        elapsed = now - self._t0
        frac = min(self._done / self.total, 1.0)
        eta = elapsed * (1 - frac) / frac if frac > 0 else None
        parts = [f"{self.label} {self._done}/{self.total} ({100 * frac:.0f}%)",
                 f"{_clock(elapsed)} elapsed"]
        if eta is not None and self._done < self.total:
            parts.append(f"ETA {_clock(eta)}")
        return ", ".join(parts + self._figures())

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def say(message: str, stream: TextIO | None = None) -> None:
    """One start-up phase line ("starting 4 workers + 1 server...", "rank 3 ready"), on a
    terminal only: a pipe or a CI log gets the plain progress line, and an error stays the
    one line on stderr."""
    stream = stream or sys.stderr
    if _terminal(stream):
        stream.write(message + "\n")
        stream.flush()


def _terminal(stream: TextIO) -> bool:
    return hasattr(stream, "isatty") and stream.isatty()


class StartupLines:
    """While a run starts, one line every ``every_s`` on how far it got (how many ranks
    logged ``ready`` to ``events``), so no run is silent for long on a terminal; it stops
    at the first training step. A context manager around the strategy's run."""

    def __init__(self, events: Path, label: str, enabled: bool = True,
                 every_s: float = 2.0, stream: TextIO | None = None) -> None:
        self.events, self.label, self.every_s = events, label, every_s
        self.stream = stream
        # its lines are for a terminal (say): on a pipe there is nothing to watch for
        self.enabled = enabled and _terminal(stream or sys.stderr)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> StartupLines:
        if self.enabled:
            start = self.events.stat().st_size if self.events.is_file() else 0
            self._thread = threading.Thread(target=self._watch, args=(start,), daemon=True,
                                            name="phalanx-startup-lines")
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self, offset: int) -> None:
        t0, ready = time.perf_counter(), 0
        while not self._stop.wait(self.every_s):
            try:
                with self.events.open("rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except OSError:
                continue
            offset += chunk.rfind(b"\n") + 1  # whole lines only
            for line in chunk[:chunk.rfind(b"\n") + 1].splitlines():
                kind = json.loads(line).get("kind") if line.strip() else None
                if kind in ("train", "lbfgs"):
                    return  # training has started: the bar takes over
                ready += kind == "ready"
            say(f"{self.label}: starting, {ready} rank(s) ready after "
                f"{time.perf_counter() - t0:.0f}s...", self.stream)
