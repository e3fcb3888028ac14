"""``phalanx interference profile``: how much of its solo rate each job class keeps beside
another on this machine, measured with real ``phalanx train`` jobs (docs/cluster.md,
"Interference profile").

For every unordered pair of classes (a class with itself included), every level and every
repeat, in that order (repeats outermost, so a drift of the machine spreads over them):

1. a's solo rate, then b's (one measurement when a is b): the job alone on ``cores[0]``;
2. both side by side: ``core`` — both on ``cores[0]``; ``server`` — a on ``cores[0]``,
   b on ``cores[1]``;
3. ``kept_a`` = a's rate beside b / a's solo rate just measured; ``kept_b`` likewise.

A pair's row holds the median over the repeats and, as its interval, the smallest and
largest repeat (``kept_a_ci``); a class's ``solo`` is the median of all its solo
measurements. The table is written with :class:`PairTable` (``interference.json``) beside
``interference.md``.
"""

from __future__ import annotations

import datetime
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from phalanx.catalog import Catalog
from phalanx.cluster.model.interference import Pair, PairTable, job_class
from phalanx.cluster.studies.interference_jobs import JobStart, WindowOptions, measure
from phalanx.cluster.studies.interference_report import write_markdown
from phalanx.cluster.studies.provenance import commit
from phalanx.errors import ConfigError
from phalanx.limits import short

PROFILE_LEVELS = ("core", "server")   # what this machine can share (no GPU level here)
# a job long enough that it never ends inside a window, with nothing but steps in it: no
# evaluation (at an epoch's end it would be one), a small initial evaluation, no progress
# bar or TensorBoard, one intra-op thread per process
LONG_RUN = ("--epochs", "1000000", "--max-steps", "1000000000", "--eval-every", "1000000000",
            "--test-limit", "200", "--threads", "1", "--no-progress", "--no-tensorboard")
CTR_SMALL = ("--data", "ctr-synthetic", "--ctr-rows", "4096", "--ctr-dim", "8",
             "--train-limit", "20000")
OVERHEAD_S = 4.5   # a measurement beyond its window: start-up, warm-up, stop (measured, 2 cores)


@dataclass(frozen=True, kw_only=True)
class JobClass:
    """A small CPU job: a step well under 100 ms on one core."""

    model: str
    strategy: str
    workers: int
    flags: tuple[str, ...]   # data set and size, beyond model / strategy / workers

    @property
    def name(self) -> str:
        return job_class(self.model, self.strategy, self.workers)

    def train_flags(self) -> tuple[str, ...]:
        # single trains in the driver (--threads); the others in worker processes
        ranks = () if self.strategy == "single" else ("--worker-threads", "1")
        return ("--model", self.model, "--strategy", self.strategy,
                "--workers", str(self.workers), *self.flags, *LONG_RUN, *ranks)

    def start(self, core: int) -> JobStart:
        return JobStart(name=self.name, core=core, ranks=self.workers,
                        argv=(sys.executable, "-m", "phalanx", "train", *self.train_flags()))


CLASSES: Catalog[JobClass] = Catalog("job class", "--classes")
for _cls, _help in (
        (JobClass(model="mlp", strategy="single", workers=1, flags=("--data", "synthetic")),
         "the MLP on synthetic data (~1 ms a step)"),
        (JobClass(model="lenet5", strategy="single", workers=1,
                  flags=("--data", "fashion-mnist")),
         "LeNet-5 on Fashion-MNIST (~10 ms a step)"),
        (JobClass(model="gpt", strategy="single", workers=1,
                  flags=("--data", "shakespeare", "--gpt-layers", "2", "--gpt-dim", "64",
                         "--gpt-heads", "2", "--context", "32", "--batch-size", "16")),
         "a 2-layer, 64-wide GPT on Tiny Shakespeare (~12 ms a step)"),
        (JobClass(model="ctr", strategy="single", workers=1, flags=CTR_SMALL),
         "the sparse click model, 4096 rows x 8 per field (~2 ms a step)"),
        (JobClass(model="mlp", strategy="sync", workers=2, flags=("--data", "synthetic")),
         "the MLP, 2 workers, synchronous allreduce"),
        (JobClass(model="ctr", strategy="asp", workers=1, flags=(*CTR_SMALL, "--servers", "1")),
         "the click model on a parameter server: 1 worker, 1 shard, ASP")):
    CLASSES.add(_cls.name, _cls, _help)


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


@dataclass(frozen=True, kw_only=True)
class ProfileOptions:
    """The profile's settings, each checked here (a one-line error naming its flag)."""

    classes: tuple[str, ...] = field(default_factory=CLASSES.names)
    only: tuple[tuple[str, str], ...] = ()   # --pairs: these pairs, not all of classes'
    levels: tuple[str, ...] = PROFILE_LEVELS
    seconds: float = 10.0
    repeats: int = 3
    warmup_steps: int = 20
    startup_timeout_s: float = 180.0
    grace_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.classes:
            raise ConfigError(f"--classes: name at least one of {', '.join(CLASSES)}")
        for name in self.classes:
            CLASSES.get(name)   # an unknown one: a line listing the known ones
        if len(set(self.classes)) != len(self.classes):
            raise ConfigError(f"--classes: {short(','.join(self.classes))} names a class twice")
        for a, b in self.only:
            if a not in self.classes or b not in self.classes:
                raise ConfigError(f"--pairs: {short(a + ':' + b)} names a class not in "
                                  f"--classes ({', '.join(self.classes)})")
        if len(set(map(frozenset, self.only))) != len(self.only):
            raise ConfigError("--pairs: a pair is named twice (a:b and b:a are one pair)")
        if not self.levels or len(set(self.levels)) != len(self.levels) or not set(
                self.levels) <= set(PROFILE_LEVELS):
            raise ConfigError(f"--levels: {short(','.join(self.levels))} is not a list of "
                              f"distinct levels of {', '.join(PROFILE_LEVELS)}")
        for flag, value, lo, hi in (("--seconds", self.seconds, 0, 3600),
                                    ("--startup-timeout", self.startup_timeout_s, 0, 3600),
                                    ("--grace", self.grace_s, 0, 600)):
            if not lo < value <= hi:   # also refuses nan
                raise ConfigError(f"{flag} must be in ({lo}, {hi}] seconds, got {value}")
        for flag, n, lo, hi in (("--repeats", self.repeats, 1, 100),
                                ("--warmup-steps", self.warmup_steps, 10, 10**6)):
            if isinstance(n, bool) or not isinstance(n, int) or not lo <= n <= hi:
                raise ConfigError(f"{flag} must be an integer in [{lo}, {hi}], got {n!r}")

    @classmethod
    def parse(cls, *, classes: str, pairs: str, levels: str,
              **numbers: float) -> ProfileOptions:
        """From the comma lists the command takes (``pairs``: ``a:b,c:d``)."""
        only = []
        for item in _csv(pairs):
            a, sep, b = item.partition(":")
            if not sep or not a or not b or ":" in b:
                raise ConfigError(f"--pairs: {short(item)} is not CLASS:CLASS")
            only.append((a, b))
        return cls(classes=_csv(classes) if classes else CLASSES.names(), only=tuple(only),
                   levels=_csv(levels), **numbers)

    def window(self) -> WindowOptions:
        return WindowOptions(seconds=self.seconds, warmup_steps=self.warmup_steps,
                             startup_timeout_s=self.startup_timeout_s, grace_s=self.grace_s)

    def pairs(self) -> list[tuple[str, str]]:
        """The unordered pairs measured: ``only``, or every pair of ``classes``."""
        if self.only:
            return list(self.only)
        return list(itertools.combinations_with_replacement(self.classes, 2))

    def measured(self) -> tuple[str, ...]:
        """The classes some pair names, in the order of ``classes``."""
        named = {c for p in self.pairs() for c in p}
        return tuple(c for c in self.classes if c in named)

    def measurements(self) -> int:
        """Windows the profile measures: per repeat, level and pair, 2 solos (1 for a class
        with itself) and the pair."""
        per = sum(2 if a == b else 3 for a, b in self.pairs())
        return self.repeats * len(self.levels) * per

    def expected_s(self) -> float:
        return self.measurements() * (self.seconds + OVERHEAD_S)


def usable_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def placement(level: str, cores: Sequence[int]) -> tuple[int, int]:
    """The cores of a pair's two jobs at ``level``."""
    if level == "core":
        return cores[0], cores[0]
    if len(cores) < 2:
        raise ConfigError(f"--levels server: needs 2 cores, this process may use only "
                          f"core {cores[0]}; use --levels core")
    return cores[0], cores[1]


def _interval(values: Sequence[float]) -> tuple[float, float]:
    return (round(min(values), 4), round(max(values), 4))


def _kept(rate: float, solo: float, what: str, say: Callable[[str], None]) -> float:
    k = rate / solo
    if k > 2.0:   # the table's bound: a job twice as fast beside another is a broken solo
        say(f"warning: {what} kept {k:.2f} of its solo rate; recorded as 2.0")
    return min(k, 2.0)


def profile(opts: ProfileOptions, out: Path, say: Callable[[str], None]) -> PairTable:
    """Measure every pair of ``opts.pairs()`` at every level, write
    ``out/interference.json`` and ``out/interference.md``; returns the table."""
    cores = usable_cores()
    for level in opts.levels:
        placement(level, cores)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {short(str(out))}: cannot make the folder ({e.strerror})"
                          ) from None
    started = datetime.datetime.now(datetime.timezone.utc)
    load0 = os.getloadavg()
    total = opts.measurements()
    say(f"interference profile: {len(opts.measured())} classes, {len(opts.pairs())} pairs, "
        f"levels {','.join(opts.levels)}, {opts.repeats} repeat(s): {total} measurements "
        f"of {opts.seconds:g} s, about {opts.expected_s() / 60:.0f} min; cores {cores}, "
        f"load {load0[0]:.2f}")
    solo: dict[str, list[float]] = {c: [] for c in opts.measured()}
    kept: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    done = 0
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="phalanx-interference-") as tmp:

        def window(starts: list[JobStart], what: str) -> list[float]:
            nonlocal done
            done += 1
            rates = measure(starts, opts.window(), Path(tmp) / f"m{done}")
            say(f"[{done}/{total}] {what}: " + " / ".join(f"{r:.1f}" for r in rates)
                + f" samples/s ({time.monotonic() - t_start:.0f} s)")
            return rates

        for rep in range(1, opts.repeats + 1):
            for level in opts.levels:
                ca, cb = placement(level, cores)
                for a, b in opts.pairs():
                    A, B = CLASSES.get(a), CLASSES.get(b)
                    sa, = window([A.start(cores[0])], f"solo {a} (repeat {rep})")
                    sb = sa if a == b else window([B.start(cores[0])],
                                                  f"solo {b} (repeat {rep})")[0]
                    solo[a].append(sa)
                    if b != a:
                        solo[b].append(sb)
                    ra, rb = window([A.start(ca), B.start(cb)],
                                    f"{level} {a} beside {b} (repeat {rep})")
                    ka = _kept(ra, sa, f"{level} {a} beside {b}", say)
                    kb = _kept(rb, sb, f"{level} {b} beside {a}", say)
                    kept.setdefault((level, a, b), []).append((ka, kb))
                    say(f"    kept {a} {ka:.3f}, {b} {kb:.3f} (sum {ka + kb:.2f})")
    load1 = os.getloadavg()
    table = PairTable(classes=_classes(opts, solo, cores), pairs=_pairs(opts, kept),
                      source=_source(opts, started, cores, load0, load1))
    table.save(out / "interference.json")
    write_markdown(table, opts.measured(), out / "interference.md")
    say(f"wrote {out}/interference.json and interference.md "
        f"({(time.monotonic() - t_start) / 60:.1f} min)")
    return table


def _classes(opts: ProfileOptions, solo: dict[str, list[float]],
             cores: Sequence[int]) -> dict[str, dict]:
    out = {}
    for name in opts.measured():
        c = CLASSES.get(name)
        out[name] = {"model": c.model, "strategy": c.strategy, "workers": c.workers,
                     "solo": round(statistics.median(solo[name]), 2),
                     "solo_range": [round(min(solo[name]), 2), round(max(solo[name]), 2)],
                     "solo_runs": len(solo[name]), "solo_core": cores[0],
                     "flags": list(c.train_flags()), "env": {"OMP_NUM_THREADS": "1"}}
    return out


def _pairs(opts: ProfileOptions, kept: dict[tuple[str, str, str],
                                          list[tuple[float, float]]]) -> list[Pair]:
    pairs = []
    for level in opts.levels:
        for a, b in opts.pairs():
            runs = kept[(level, a, b)]
            ka, kb = [k for k, _ in runs], [k for _, k in runs]
            pairs.append(Pair(level, a, b, round(statistics.median(ka), 4),
                              round(statistics.median(kb), 4), len(runs),
                              _interval(ka), _interval(kb)))
    return pairs


def _source(opts: ProfileOptions, started: datetime.datetime, cores: Sequence[int],
            load0: tuple[float, ...], load1: tuple[float, ...]) -> str:
    la = lambda v: "/".join(f"{x:.2f}" for x in v)  # noqa: E731
    return (f"phalanx interference profile, {started:%Y-%m-%d %H:%M} UTC, commit {commit()}; "
            f"{os.cpu_count()} cores ({len(cores)} usable: {','.join(map(str, cores))}); "
            f"load average (1/5/15 min) {la(load0)} at start, {la(load1)} at end; "
            f"--seconds {opts.seconds:g} --repeats {opts.repeats} --levels "
            f"{','.join(opts.levels)} --warmup-steps {opts.warmup_steps}; interval: min..max "
            f"of the repeats; solo: alone on core {cores[0]}, measured before each pair")
