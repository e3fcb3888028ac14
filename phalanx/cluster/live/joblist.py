"""Job lists for live mode (``phalanx schedule --jobs FILE``): YAML or CSV.

YAML::

    jobs:
      - name: mlp-a            # letters, digits, - _ . (it names the job's output folder)
        arrival: 0             # seconds after the scheduler starts
        gpus: 1                # gang size: devices (slots) held, and --workers of the run
        duration: 30           # optional estimate in seconds (what SJF orders by)
        profile: {a100: 900, t4: 250}   # optional, on a cluster of several device types:
                               # samples/s on 1 GPU of each type (Sia's bootstrap profile;
                               # read by --policy goodput only)
        config: {model: mlp, data: synthetic, max_steps: 20, strategy: single}

CSV: a header ``name,arrival,gpus[,duration],<RunConfig field>...``; each further column is
a training setting (``model``, ``max_steps``, ``strategy``, ...), an empty cell keeps its
default.

Everything is checked before any job starts, each as one line naming the file, the job
and the field: the list's shape (names, arrivals, gang sizes, setting names), each job's
settings as ``phalanx train`` checks them (:func:`check_settings`) and each gang against
the cluster (:func:`check_fits`). A list that cannot run as written is refused whole,
rather than running the other jobs and leaving one out.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.cluster.core.cluster_file import read_yaml
from phalanx.cluster.core.jobs import JobSpec
from phalanx.cluster.core.scheduler import oversize_reason, usable_gpus
from phalanx.cluster.core.topology import Topology
from phalanx.cluster.model.interference import FAMILY, job_class
from phalanx.config import RunConfig
from phalanx.data import DataOptions, load_data
from phalanx.errors import ConfigError, DataError
from phalanx.parallel.registry import NAMES, check_config, check_flags_apply, spec
from phalanx.runtime.placement import check_run

# set by the scheduler, never by the job: where it writes, how many workers (the gang size)
RESERVED = {"out": "the scheduler sets it to OUT/jobs/NAME",
            "workers": "the gang size 'gpus' is the number of workers",
            # a job writes only in its own folder: resuming another run would write there
            "resume": "a job runs in OUT/jobs/NAME and cannot resume another run's folder",
            "overwrite": "each job's folder is new"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SETTINGS = {f.name for f in dataclasses.fields(RunConfig)}
_DEFAULT_STRATEGY = next(f.default for f in dataclasses.fields(RunConfig) if f.name == "strategy")
# live mode waits in real time for an arrival: a job list spans hours or days, not decades
MAX_ARRIVAL_S = 30 * 86400.0


def gang_settings(config: dict[str, Any], gpus: int) -> dict[str, Any]:
    """A job's settings with its gang size as ``workers``, unless its strategy runs a
    process per something else (pipeline: ``--stages``; ``workers`` is then refused as
    unused, and the gang size is checked against the ranks it computes on)."""
    name = config.get("strategy", _DEFAULT_STRATEGY)
    unused = name in NAMES and "workers" in spec(name).unused  # an unknown name: checked later
    return dict(config) if unused else {**config, "workers": gpus}


@dataclass(frozen=True)
class LiveJob:
    """One entry of a job list: the scheduler's ``JobSpec`` and the training settings its
    run gets."""

    spec: JobSpec                  # submit = arrival offset (s), gpus = gang size
    config: dict[str, Any]         # RunConfig settings (values checked by the run itself)
    # samples/s on 1 GPU of each device type, as the user measured it (Sia's bootstrap
    # profile); empty: the types' declared speeds (:func:`check_profiles`)
    profile: dict[str, float] = dataclasses.field(default_factory=dict)


def _number(v: Any, where: str, field: str, integer: bool, minimum: float) -> float:
    if isinstance(v, bool):
        raise DataError(f"{where}: {field} must be a number, got {v!r}")
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise DataError(f"{where}: {field} must be a number, got {v!r}") from None
    if not math.isfinite(x) or x < minimum or (integer and not x.is_integer()):
        kind = "an integer" if integer else "a number"
        raise DataError(f"{where}: {field} must be {kind} >= {minimum:g}, got {v!r}")
    return x


def _job(i: int, entry: Any, where: str, seen: set[str]) -> LiveJob:
    if not isinstance(entry, dict):
        raise DataError(f"{where}: expected a mapping with name, arrival, gpus, config")
    unknown = sorted(set(entry) - {"name", "arrival", "gpus", "duration", "profile",
                                   "config"})
    if unknown:
        raise DataError(f"{where}: unknown key(s) {', '.join(map(str, unknown))} (allowed: "
                        f"name, arrival, gpus, duration, profile, config)")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise DataError(f"{where}: name must be 1-64 letters, digits, '-', '_' or '.', "
                        f"got {name!r}")
    if name in seen:
        raise DataError(f"{where}: duplicate job name {name!r}")
    seen.add(name)
    where = f"{where} ({name})"
    for key in ("arrival", "gpus"):
        if key not in entry:
            raise DataError(f"{where}: missing '{key}'")
    arrival = _number(entry["arrival"], where, "arrival", False, 0)
    if arrival > MAX_ARRIVAL_S:
        raise DataError(f"{where}: arrival {arrival:g} s is more than {MAX_ARRIVAL_S:g} s "
                        "(30 days) away; live mode waits for it in real time")
    gpus = int(_number(entry["gpus"], where, "gpus", True, 1))
    duration = _number(entry.get("duration", 0), where, "duration", False, 0)
    config = entry.get("config", {})
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise DataError(f"{where}: config must be a mapping of training settings")
    for key in config:
        k = str(key).replace("-", "_")
        if k in RESERVED:
            raise DataError(f"{where}: config.{key}: do not set it ({RESERVED[k]})")
        if k not in _SETTINGS:
            raise DataError(f"{where}: config.{key}: unknown training setting")
    if duration > MAX_ARRIVAL_S:
        raise DataError(f"{where}: duration {duration:g} s is more than {MAX_ARRIVAL_S:g} s")
    profile = entry.get("profile", {})
    if not isinstance(profile, dict) or ("profile" in entry and not profile):
        raise DataError(f"{where}: profile must be a mapping of device type to samples/s "
                        f"on 1 GPU of it (e.g. {{a100: 900, t4: 250}}), got {profile!r}")
    rates = {str(t): _number(v, where, f"profile.{t}", False, 0) for t, v in profile.items()}
    for t, v in rates.items():
        if v <= 0:
            raise DataError(f"{where}: profile.{t} must be > 0 samples/s, got {v:g}")
    model, strategy = str(config.get("model", "")), str(config.get("strategy", "single"))
    spec = JobSpec(i, name, arrival, gpus, max(duration, 1.0), duration, model,
                   cpu_per_gpu=1, kind=job_class(model, strategy, gpus)
                   if strategy in FAMILY else "")
    return LiveJob(spec, dict(config), rates)


def _rows_from_csv(p: Path, text: str) -> list[tuple[str, dict[str, Any]]]:
    rows = list(csv.reader(text.splitlines()))
    if not rows or rows[0][:3] != ["name", "arrival", "gpus"]:
        raise DataError(f"job list {p}: line 1: expected header name,arrival,gpus[,duration],"
                        f"SETTING...")
    header = rows[0]
    out = []
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(header):
            raise DataError(f"job list {p}: line {line}: expected {len(header)} fields, "
                            f"got {len(row)}")
        entry: dict[str, Any] = {"name": row[0], "arrival": row[1], "gpus": row[2],
                                 "config": {}}
        for key, value in zip(header[3:], row[3:]):
            if key == "duration":
                if value:
                    entry["duration"] = value
            elif value != "":
                entry["config"][key] = value
        out.append((f"line {line}", entry))
    return out


def load_job_list(path: str | Path) -> list[LiveJob]:
    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"job list {p}: cannot read ({getattr(e, 'strerror', None) or e})"
                        ) from None
    if p.suffix in (".yaml", ".yml"):
        data = read_yaml(text, f"job list {p}", DataError)
        if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
            raise DataError(f"job list {p}: expected a mapping with a 'jobs' list")
        entries = [(f"jobs[{i}]", e) for i, e in enumerate(data["jobs"])]
    elif p.suffix == ".csv":
        entries = _rows_from_csv(p, text)
    else:
        raise ConfigError(f"--jobs {p}: expected a .yaml, .yml or .csv file")
    if not entries:
        raise DataError(f"job list {p}: no jobs")
    seen: set[str] = set()
    jobs = [_job(i, e, f"job list {p}: {where}", seen) for i, (where, e) in enumerate(entries)]
    return sorted(jobs, key=lambda j: (j.spec.submit, j.spec.id))


def check_settings(jobs: list[LiveJob], source: str) -> None:
    """Each job's training settings, checked as ``phalanx train`` checks them before any
    job starts: types and ranges, what the strategy can honour, a setting it would ignore,
    the gang size against the devices the strategy computes on, the device on this
    machine, and the data (its files opened and their headers read)."""
    data_seen: dict[tuple, None] = {}
    for job in jobs:
        where = f"job list {source}: {job.spec.name}"
        cfg = RunConfig.from_mapping(gang_settings(job.config, job.spec.gpus),
                                     source=f"{where}: config")
        try:
            check_config(cfg)
            check_flags_apply(cfg)
            s = spec(cfg.strategy)
            ranks, _ = s.compute_ranks(cfg)
            if ranks != job.spec.gpus:
                raise ConfigError(f"gpus {job.spec.gpus}: --strategy {cfg.strategy} computes "
                                  f"on {ranks} device(s) with these settings; give gpus: "
                                  f"{ranks}")
            check_run(cfg, s.world_size(cfg), s.device)
            key = (cfg.data, cfg.data_dir, cfg.context, cfg.tokens, cfg.seed)
            if key not in data_seen:  # the first samples only: files, headers, the task
                data_seen[key] = None
                load_data(cfg.data, cfg.data_dir, cfg.seed, 1, 1,
                          DataOptions(cfg.context, cfg.tokens))
        except (ConfigError, DataError) as e:
            raise DataError(f"{where}: {e}") from None


def check_fits(jobs: list[LiveJob], topology: Topology, source: str) -> None:
    """Refuse a gang the cluster can never hold (the scheduler's own rule,
    :func:`~phalanx.cluster.core.scheduler.oversize_reason`): it could never start."""
    usable = usable_gpus(topology)
    for job in jobs:
        g = job.spec.gpus
        if g > topology.num_devices:
            raise DataError(f"job list {source}: {job.spec.name}: gpus {g} is more than the "
                            f"cluster's {topology.num_devices} slot(s)")
        reason = oversize_reason(g, topology.num_devices, usable)
        if reason:   # enough slots, not enough with a free CPU core each
            raise DataError(f"job list {source}: {job.spec.name}: gpus {g}: {reason}")
    check_types(jobs, topology, source)


def check_profiles(jobs: list[LiveJob], topology: Topology, source: str,
                   typed_goodput: bool) -> None:
    """A job's ``profile`` is read by ``--policy goodput`` on a cluster of several device
    types only, and must give every type of the cluster (its figures are compared with
    each other, never with the types' declared speeds)."""
    have = sorted({s.device_type for s in topology.servers})
    for job in jobs:
        if not job.profile:
            continue
        where = f"job list {source}: {job.spec.name}: profile"
        if not typed_goodput:
            raise DataError(f"{where}: only --policy goodput on a cluster of several device "
                            f"types reads it (this cluster: {', '.join(have)})")
        unknown = sorted(set(job.profile) - set(have))
        missing = [t for t in have if t not in job.profile]
        if unknown:
            raise DataError(f"{where}: unknown device type(s) {', '.join(unknown)} (the "
                            f"cluster's: {', '.join(have)})")
        if missing:
            raise DataError(f"{where}: lacks {', '.join(missing)} (give every type of the "
                            f"cluster: {', '.join(have)})")


def slow_ranks(cfg: RunConfig, slowdown: float) -> dict[int, float]:
    """``--slow-workers`` for every compute rank of ``cfg`` (none at slowdown 1): how a
    rank emulates a device type ``slowdown`` times slower."""
    if slowdown <= 1.0:
        return {}
    return dict.fromkeys(range(spec(cfg.strategy).compute_ranks(cfg)[0]), float(slowdown))


def check_types(jobs: list[LiveJob], topology: Topology, source: str) -> None:
    """On a cluster of several device types a gang runs on one type: one that no type can
    hold is refused. On an emulated type (``slowdown`` > 1) the scheduler sets each
    compute rank's ``--slow-workers``: a job that sets its own, or whose strategy cannot
    be slowed, is refused there."""
    per_type: dict[str, int] = {}
    for srv in topology.servers:
        per_type[srv.device_type] = (per_type.get(srv.device_type, 0)
                                     + min(srv.num_devices, srv.cpu_cores))
    slowed = {t: x.slowdown for t, x in topology.device_types.items()
              if x.slowdown > 1 and t in per_type}
    for job in jobs:
        g, name = job.spec.gpus, job.spec.name
        holds = [t for t, n in per_type.items() if n >= g]
        if topology.typed and not holds:
            have = ", ".join(f"{t} {n}" for t, n in sorted(per_type.items()))
            raise DataError(f"job list {source}: {name}: gpus {g}: no device type holds it "
                            f"({have}); a gang across types is refused (a job runs on one "
                            f"type at a time)")
        slow = [t for t in holds if t in slowed]
        if not slow:
            continue
        cfg = RunConfig.from_mapping(gang_settings(job.config, g), source=f"job {name}")
        if cfg.slow_workers:
            raise DataError(f"job list {source}: {name}: slow_workers: the cluster emulates "
                            f"device type {slow[0]} (slowdown {slowed[slow[0]]:g}); the "
                            f"scheduler sets each rank's slowdown from its device's type")
        try:
            check_config(dataclasses.replace(cfg, slow_workers=slow_ranks(cfg, slowed[slow[0]])))
        except ConfigError as e:
            raise DataError(f"job list {source}: {name}: cannot run on emulated device type "
                            f"{slow[0]} (slowdown {slowed[slow[0]]:g}): {e}") from None
