"""Trace readers (Philly, Pollux workloads) and a seeded synthetic generator.

A malformed row raises ``DataError`` naming the file and line, or, with
``skip_bad_rows``, is skipped and counted in ``Trace.skipped``.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from phalanx.cluster.core.jobs import JobSpec
from phalanx.cluster.core.topology import Topology
from phalanx.cluster.model.families import load_profiles
from phalanx.cluster.model.perf import ideal_shape
from phalanx.cluster.model.profiles import PolluxApplication, load_pollux_apps
from phalanx.cluster.model.sia_apps import SIA_REFERENCE_TYPE, load_sia_apps
from phalanx.errors import ConfigError, DataError
from phalanx.limits import MAX_SEED

PHILLY_HEADER = ["timestamp", "duration", "num_gpus", "gpu_time", "cluster"]
POLLUX_HEADER = ["name", "time", "application", "num_replicas", "batch_size"]
MAX_GANG = 1 << 16  # GPUs one job may ask for; a larger row is a bad row, not a plan
# arrivals compressed 1000x already pile a two-month trace into under two hours
MAX_LOAD_SCALE = 1000.0
MAX_DURATION_S = 1e8  # ~3 years of one job (Philly's longest is ~60 days)


@dataclass(frozen=True)
class TraceOptions:
    """How a trace is read: data folder, seed, bad rows, limit, load scale."""

    data_dir: Path
    seed: int = 0
    skip_bad_rows: bool = False
    limit: int = 0                 # keep the first N jobs by submit time (0 = all)
    load_scale: float = 1.0        # >1 compresses inter-arrival times (more load)
    cpu_per_gpu: int = 4

    def __post_init__(self) -> None:
        if self.limit < 0:
            raise ConfigError(f"--limit must be >= 0, got {self.limit}")
        if not 0 < self.load_scale <= MAX_LOAD_SCALE:
            raise ConfigError(f"--load-scale must be a number in (0, {MAX_LOAD_SCALE:g}], "
                              f"got {self.load_scale}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"--seed must be in 0..{MAX_SEED}, got {self.seed}")
        if self.cpu_per_gpu < 1:
            raise ConfigError(f"--cpu-per-gpu must be >= 1, got {self.cpu_per_gpu}")


@dataclass(frozen=True)
class Trace:
    """A loaded trace: its jobs, where they came from, how many rows were skipped."""

    jobs: tuple[JobSpec, ...]
    source: str
    skipped: int = 0


class _Rows:
    """Parse rows with a per-row function; errors carry the line number."""

    def __init__(self, path: Path, header: list[str], skip_bad: bool) -> None:
        self.path, self.header, self.skip_bad = path, header, skip_bad
        self.skipped = 0

    def parse(self, fn: Callable[[list[str]], JobSpec | None]) -> list[JobSpec]:
        try:
            f = self.path.open(newline="")
        except OSError as e:
            raise DataError(f"trace {self.path}: cannot read ({e.strerror})") from None
        with f:
            try:
                return self._parse_rows(csv.reader(f), fn)
            except (UnicodeDecodeError, csv.Error) as e:
                raise DataError(f"trace {self.path}: not a text CSV file ({e})") from None

    def _parse_rows(self, reader: Iterator[list[str]],
                    fn: Callable[[list[str]], JobSpec | None]) -> list[JobSpec]:
        out: list[JobSpec] = []
        header = next(reader, None)
        if header != self.header:
            raise DataError(f"trace {self.path}: line 1: expected header "
                            f"{','.join(self.header)}, got {header}")
        for line, row in enumerate(reader, start=2):
            if not row:
                continue   # blank line (the Philly file ends with one)
            if any("\n" in cell or "\r" in cell for cell in row):
                # an unterminated quote swallowed the rows after it: never skip those silently
                raise DataError(f"trace {self.path}: line {line}: a quoted field runs over "
                                "several lines (unterminated quote?)")
            try:
                if len(row) != len(self.header):
                    raise ValueError(f"expected {len(self.header)} fields, got {len(row)}")
                job = fn(row)
            except (ValueError, KeyError) as e:
                if self.skip_bad:
                    self.skipped += 1
                    continue
                raise DataError(f"trace {self.path}: line {line}: {e}") from None
            if job is not None:
                out.append(job)
        return out


def _positive(text: str, what: str, kind: type = float, high: float = math.inf) -> float:
    try:
        v = kind(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a number") from None
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"{what} must be > 0, got {text!r}")
    if v > high:
        raise ValueError(f"{what} {text} is more than {high:g}")
    return v


def _gang(text: str, what: str) -> int:
    gpus = int(_positive(text, what, int))
    if gpus > MAX_GANG:
        raise ValueError(f"{what} {gpus} is more than {MAX_GANG} GPUs")
    return gpus


def _finish(jobs: list[JobSpec], source: str, skipped: int, limit: int,
            load_scale: float) -> Trace:
    """The trace's jobs by submit time, the first ``limit`` (0: all), submits from 0 and
    divided by ``load_scale``."""
    jobs.sort(key=lambda j: (j.submit, j.id))
    if limit:
        jobs = jobs[:limit]
    if not jobs:
        raise DataError(f"trace {source}: no jobs")
    t0 = jobs[0].submit
    out = tuple(replace(j, id=i, submit=(j.submit - t0) / load_scale)
                for i, j in enumerate(jobs))
    return Trace(out, source, skipped)


def read_philly(path: Path, opts: TraceOptions) -> Trace:
    """Philly (Sep-Dec 2017): each job gets a model profile drawn with ``opts.seed`` (the
    trace has no model column); work = the trace duration (seconds at the ideal placement)."""
    models = sorted(load_profiles(opts.data_dir))
    rng = random.Random(opts.seed)
    rows = _Rows(path, PHILLY_HEADER, opts.skip_bad_rows)
    counter = iter(range(1 << 62))

    def parse(row: list[str]) -> JobSpec:
        try:
            when = datetime.fromisoformat(row[0])
        except ValueError:
            raise ValueError(f"timestamp {row[0]!r} is not YYYY-MM-DD HH:MM:SS") from None
        try:
            submit = when.timestamp()   # local time, as the published reproductions used
        except (ValueError, OverflowError, OSError):
            raise ValueError(f"timestamp {row[0]!r} is out of range (years 1970..9999)"
                             ) from None
        duration = _positive(row[1], "duration", high=MAX_DURATION_S)
        gpus = _gang(row[2], "num_gpus")
        _positive(row[3], "gpu_time", high=MAX_DURATION_S * MAX_GANG)
        if not row[4]:
            raise ValueError("cluster is empty")
        i = next(counter)
        return JobSpec(i, f"philly-{i}", submit, gpus, duration, duration, rng.choice(models),
                       opts.cpu_per_gpu, row[4])

    jobs = rows.parse(parse)
    return _finish(jobs, str(path), rows.skipped, opts.limit, opts.load_scale)


def read_pollux(path: Path, opts: TraceOptions, node_gpus: int = 4,
                apps: Mapping[str, PolluxApplication] | None = None) -> Trace:
    """A Pollux workload: work = steps to train the application's fixed number of epochs
    at the row's total batch (``PolluxApplication.work_steps``); duration = steps x the
    measured step time on the tightest placement of ``num_replicas`` GPUs on
    ``node_gpus``-GPU nodes (of ``apps``' profiles: Pollux's unless given)."""
    apps = apps if apps is not None else load_pollux_apps(opts.data_dir)
    rows = _Rows(path, POLLUX_HEADER, opts.skip_bad_rows)
    counter = iter(range(1 << 62))
    names: set[str] = set()

    def parse(row: list[str]) -> JobSpec:
        name, app = row[0], row[2]
        if name in names:
            raise ValueError(f"job name {name!r} is used twice")
        if app not in apps:
            raise ValueError(f"application {app!r} is not one of {', '.join(sorted(apps))}")
        try:
            submit = float(row[1])
        except ValueError:
            raise ValueError(f"time {row[1]!r} is not a number") from None
        if not (submit >= 0 and math.isfinite(submit)):
            raise ValueError(f"time must be >= 0, got {row[1]!r}")
        gpus = _gang(row[3], "num_replicas")
        batch = int(_positive(row[4], "batch_size", int))
        a = apps[app]
        if batch > a.max_batch:
            raise ValueError(f"batch_size {batch} is more than {app}'s largest profiled "
                             f"batch {a.max_batch}")
        steps = a.work_steps(gpus, batch)
        counts = tuple([node_gpus] * (gpus // node_gpus)
                       + ([gpus % node_gpus] if gpus % node_gpus else []))
        duration = steps * a.step_time(counts, batch)
        names.add(name)
        return JobSpec(next(counter), name, submit, gpus, steps, duration, app, 4, "",
                       batch)

    jobs = rows.parse(parse)
    return _finish(jobs, str(path), rows.skipped, opts.limit, opts.load_scale)


SIA_WORKLOADS = {"philly": 8, "saturn": 10}


def read_sia(spec: str, opts: TraceOptions, node_gpus: int = 4) -> Trace:
    """``sia:philly:N`` (1..8) or ``sia:saturn:N`` (1..10): Sia's workloads
    (``sia/workloads/<family>/workload-N.csv``, the Pollux format), read against Sia's
    profiles of its reference type (``SIA_REFERENCE_TYPE``)."""
    parts = spec.split(":")
    fam = parts[1] if len(parts) == 3 else ""
    n = SIA_WORKLOADS.get(fam, 0)
    if not n or not parts[2].isdigit() or not 1 <= int(parts[2]) <= n:
        raise ConfigError(f"--trace {spec}: expected sia:philly:1..8 or sia:saturn:1..10")
    path = opts.data_dir / "sia" / "workloads" / fam / f"workload-{int(parts[2])}.csv"
    if not path.exists():
        raise DataError(f"--trace {spec}: no {path}; is ../shared/data/sia present?")
    apps = load_sia_apps(opts.data_dir, [SIA_REFERENCE_TYPE])[SIA_REFERENCE_TYPE]
    return read_pollux(path, opts, node_gpus, apps)


# bounds of a synthetic trace: a million jobs, a gang of MAX_GANG, finite rates and times
SYNTHETIC_MAX = {"jobs": 1e6, "rate": 1e9, "median": 1e9, "max_gpus": MAX_GANG}


@dataclass(frozen=True)
class SyntheticSpec:
    """A synthetic trace's shape: jobs, arrival rate, median duration, largest gang."""

    jobs: int = 200
    rate_per_h: float = 30.0          # Poisson arrivals
    median_s: float = 3600.0          # log-normal durations (sigma 1.5, Philly-like tail)
    max_gpus: int = 32

    @staticmethod
    def parse(text: str) -> SyntheticSpec:
        """``synthetic:jobs=200,rate=30,median=3600,max_gpus=32``"""
        fields = {"jobs": int, "rate": float, "median": float, "max_gpus": int}
        values: dict[str, float] = {}
        for part in filter(None, text.split(":", 1)[1].split(",") if ":" in text else []):
            k, _, v = part.partition("=")
            if k not in fields:
                raise ConfigError(f"--trace {text}: unknown key {k!r} (keys: {', '.join(fields)})")
            try:
                values[k] = fields[k](v)
            except ValueError:
                raise ConfigError(f"--trace {text}: {k}={v!r} is not a number") from None
            if not values[k] > 0:
                raise ConfigError(f"--trace {text}: {k} must be > 0")
            if not values[k] <= SYNTHETIC_MAX[k]:
                raise ConfigError(f"--trace {text}: {k} must be at most {SYNTHETIC_MAX[k]:g}")
        return SyntheticSpec(int(values.get("jobs", 200)), values.get("rate", 30.0),
                             values.get("median", 3600.0), int(values.get("max_gpus", 32)))


def synthetic(spec: SyntheticSpec, opts: TraceOptions) -> Trace:
    """Seeded jobs: gang sizes with Philly's proportions (capped at ``max_gpus``)."""
    rng = random.Random(opts.seed)
    models = sorted(load_profiles(opts.data_dir))
    sizes = [(1, 76627), (2, 1818), (4, 1870), (8, 1643), (16, 199), (32, 67), (64, 6)]
    sizes = [(g, w) for g, w in sizes if g <= spec.max_gpus] or [(1, 1)]
    gangs, weights = zip(*sizes)
    t, jobs = 0.0, []
    for i in range(spec.jobs):
        t += rng.expovariate(spec.rate_per_h / 3600.0)
        d = max(60.0, spec.median_s * math.exp(rng.gauss(0.0, 1.5)))
        jobs.append(JobSpec(i, f"syn-{i}", t, rng.choices(gangs, weights)[0], d, d,
                            rng.choice(models), opts.cpu_per_gpu, f"vc{rng.randrange(4)}"))
    return _finish(jobs, "synthetic", 0, opts.limit, opts.load_scale)


def load_trace(spec: str, opts: TraceOptions, topology: Topology | None = None) -> Trace:
    """``philly`` | ``pollux:N`` (workload N) | ``synthetic[:k=v,...]`` | a CSV path (Philly
    or Pollux format, told apart by the header)."""
    node_gpus = ideal_shape(4, topology)[0][0] if topology is not None else 4
    if spec == "philly":
        return read_philly(opts.data_dir / "philly" / "philly.csv", opts)
    if spec.startswith("pollux:"):
        path = opts.data_dir / "pollux" / "workloads" / f"workload-{spec.split(':', 1)[1]}.csv"
        if not path.exists():
            raise ConfigError(f"--trace {spec}: no {path} (workloads are 1..8)")
        return read_pollux(path, opts, node_gpus)
    if spec.startswith("sia:"):
        return read_sia(spec, opts, node_gpus)
    if spec == "synthetic" or spec.startswith("synthetic:"):
        return synthetic(SyntheticSpec.parse(spec), opts)
    path = Path(spec)
    try:
        with path.open(newline="") as f:
            header = next(csv.reader(f), None)
    except OSError as e:
        raise DataError(f"trace {path}: cannot read ({e.strerror})") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"trace {path}: not a text CSV file ({e})") from None
    if header == POLLUX_HEADER:
        return read_pollux(path, opts, node_gpus)
    return read_philly(path, opts)
