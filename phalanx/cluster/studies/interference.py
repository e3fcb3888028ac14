"""``phalanx interference profile``: how much of its solo rate each job class keeps beside
another on this machine, measured with real ``phalanx train`` jobs (docs/cluster.md,
"Interference profile").

For every unordered pair of classes (a class with itself included), every level and every
repeat, in that order (repeats outermost, so a drift of the machine spreads over them):

1. a's solo rate, then b's (one measurement when a is b): the job alone on ``cores[0]``;
2. both side by side: ``core`` — both on ``cores[0]``; ``server`` — a on ``cores[0]``,
   b on ``cores[1]``; ``link`` — on two test hosts (``phalanx.runtime.hosts``) joined by a
   link shaped to ``--link-rate``, host i pinned to ``cores[i]``: a class of several
   ranks runs rank i on host i (both such jobs share the link, and each host's core), a
   single-process class on host 0's core (two of them: one per host); solos run on the
   same shaped link;
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
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from phalanx.cluster.model.interference import Pair, PairTable
from phalanx.cluster.studies.interference_classes import (
    CLASSES,
    CORE_CLASSES,
    LINK_CLASSES,
    Host,
    pair_starts,
    placement,
    solo_start,
)
from phalanx.cluster.studies.interference_jobs import JobStart, WindowOptions, measure
from phalanx.cluster.studies.interference_report import write_markdown
from phalanx.cluster.studies.provenance import commit
from phalanx.errors import ConfigError
from phalanx.limits import short

__all__ = ["CLASSES", "Host", "PROFILE_LEVELS", "ProfileOptions", "placement", "profile"]

PROFILE_LEVELS = ("core", "server", "link")   # what this machine can share (no GPU here)
DEFAULT_LEVELS = ("core", "server")
LINK_RATE_MBIT = 20.0   # --link-rate: where the sync MLP's step is ~98% communication
PORT = 29500            # rank 0's store on test host 0 (each host has a port space of its own)
OVERHEAD_S = 4.5        # a measurement beyond its window: start-up, warm-up, stop (2 cores)
LINK_OVERHEAD_S = 9.0   # the same across test hosts (ranks start, slow steps): 22 min for 78 x 8 s


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


@dataclass(frozen=True, kw_only=True)
class ProfileOptions:
    """The profile's settings, each checked here (a one-line error naming its flag)."""

    classes: tuple[str, ...] = CORE_CLASSES
    only: tuple[tuple[str, str], ...] = ()   # --pairs: these pairs, not all of classes'
    levels: tuple[str, ...] = DEFAULT_LEVELS
    link_rate: float = LINK_RATE_MBIT        # Mbit/s of the test hosts' link (level link)
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
        for flag, value, lo, hi in (("--link-rate", self.link_rate, 0, 100000),
                                    ("--seconds", self.seconds, 0, 3600),
                                    ("--startup-timeout", self.startup_timeout_s, 0, 3600),
                                    ("--grace", self.grace_s, 0, 600)):
            if not lo < value <= hi:   # also refuses nan
                unit = "Mbit/s" if flag == "--link-rate" else "seconds"
                raise ConfigError(f"{flag} must be in ({lo}, {hi}] {unit}, got {value}")
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
        lv = _csv(levels)
        default = LINK_CLASSES if lv == ("link",) else CORE_CLASSES
        return cls(classes=_csv(classes) if classes else default, only=tuple(only),
                   levels=lv, **numbers)

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
        per_level = self.measurements() / len(self.levels)
        return sum(per_level * (self.seconds + (LINK_OVERHEAD_S if lv == "link" else
                                                OVERHEAD_S)) for lv in self.levels)


def usable_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def _interval(values: Sequence[float]) -> tuple[float, float]:
    return (round(min(values), 4), round(max(values), 4))


def _kept(rate: float, solo: float, what: str, say: Callable[[str], None]) -> float:
    k = rate / solo
    if k > 2.0:   # the table's bound: a job twice as fast beside another is a broken solo
        say(f"warning: {what} kept {k:.2f} of its solo rate; recorded as 2.0")
    return min(k, 2.0)


def profile(opts: ProfileOptions, out: Path, say: Callable[[str], None],
            hosts: Sequence[Host] = ()) -> PairTable:
    """Measure every pair of ``opts.pairs()`` at every level, write
    ``out/interference.json`` and ``out/interference.md``; returns the table. Level
    ``link`` runs on ``hosts`` (two test hosts whose link is shaped to
    ``opts.link_rate``: the command makes them)."""
    cores = usable_cores()
    for level in opts.levels:
        placement(level, cores)
    if "link" in opts.levels and len(hosts) != 2:
        raise ConfigError(f"--levels link: needs 2 test hosts, got {len(hosts)}")
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
    solo: dict[tuple[str, str], list[float]] = {}   # (class, "link" or "") -> solo rates
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
                on = "link" if level == "link" else ""
                for a, b in opts.pairs():
                    A, B = CLASSES.get(a), CLASSES.get(b)
                    # a port pair per measurement: a stopped job's store may linger a moment
                    port = PORT + 2 * (done % 500)
                    sa, = window([solo_start(level, A, cores, hosts, port)],
                                 f"solo {a}{' (link)' if on else ''} (repeat {rep})")
                    sb = sa if a == b else window([solo_start(level, B, cores, hosts, port)],
                                                  f"solo {b}{' (link)' if on else ''} "
                                                  f"(repeat {rep})")[0]
                    solo.setdefault((a, on), []).append(sa)
                    if b != a:
                        solo.setdefault((b, on), []).append(sb)
                    ra, rb = window(pair_starts(level, A, B, cores, hosts, port),
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


def _classes(opts: ProfileOptions, solo: dict[tuple[str, str], list[float]],
             cores: Sequence[int]) -> dict[str, dict]:
    """Each class's solo rate: ``solo`` alone on ``cores[0]`` (at ``link`` only: on the
    shaped link), and ``solo_link`` on the shaped link when level link was measured."""
    out = {}
    for name in opts.measured():
        c = CLASSES.get(name)
        here, link = solo.get((name, ""), []), solo.get((name, "link"), [])
        rates = here or link
        info = {"model": c.model, "strategy": c.strategy, "workers": c.workers,
                "solo": round(statistics.median(rates), 2),
                "solo_range": [round(min(rates), 2), round(max(rates), 2)],
                "solo_runs": len(rates), "solo_core": cores[0]}
        if link:
            info.update(solo_link=round(statistics.median(link), 2),
                        solo_link_range=[round(min(link), 2), round(max(link), 2)],
                        link_mbit=opts.link_rate, processes=c.world)
        out[name] = {**info, "flags": list(c.train_flags()),
                     "env": {"OMP_NUM_THREADS": "1"}}
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
            f"{','.join(opts.levels)} --warmup-steps {opts.warmup_steps}"
            + (f" --link-rate {opts.link_rate:g} (2 test hosts, host i on core "
               f"{cores[0]}/{cores[1]})" if "link" in opts.levels else "")
            + f"; interval: min..max of the repeats; solo: alone on core {cores[0]} (at "
            f"link: a multi-process class across the hosts), measured before each pair")
