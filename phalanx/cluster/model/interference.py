"""Pairwise interference: how much of its solo rate a job keeps beside another, per job
class and sharing level, measured (``phalanx interference profile``, the live loop) or
published (Gavel's co-located pairs), and a model that predicts the pairs not measured.

A *job class* is model x strategy family x workers, named ``"{model}-{family}-{workers}"``
(``mlp-single-1``, ``gpt-sync-2``, ``ctr-ps-1``). A *level* is what the two jobs share:

* ``core`` — a CPU core (here a live slot's PCIe switch is pinned to one core: two jobs
  on one switch time-share it);
* ``server`` — the machine but not a core (caches, memory bandwidth, the loopback);
* ``link`` — the network between servers: two jobs whose ranks span the same servers
  share those servers' links (measured on test hosts joined by a ``tc``-shaped link; a
  job on one server does not use it);
* ``device`` — one GPU (Gavel's space-sharing pairs, V100, one worker each).

``kept(a, b, level)`` is a's rate beside b over a's rate alone (1 = no interference, 0.5 =
half speed), as Gavel reports pairs. A table holds what was measured; :class:`PairModel`
fits ``kept(a, b) = 1 / (1 + s_a * p_b)`` per level (a's sensitivity, b's pressure: 2n
numbers for n^2 pairs) by least squares on ``1/kept - 1``, so a pair never measured is
predicted from each side's other pairs.

The file (``interference.json``)::

    {"format": "phalanx-interference", "version": 1, "source": "...",
     "classes": {"mlp-single-1": {"model": "mlp", "strategy": "single", "workers": 1,
                                  "solo": 812.0}, ...},
     "pairs": [{"level": "core", "a": "mlp-single-1", "b": "gpt-single-1",
                "kept_a": 0.52, "kept_b": 0.49, "repeats": 3,
                "kept_a_ci": [0.50, 0.54], "kept_b_ci": [0.47, 0.51]}, ...]}

``solo`` is the class's solo samples/s; a pair row gives both sides (``a`` may equal
``b``: two copies of one class).
"""

from __future__ import annotations

import ast
import json
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from phalanx.cluster.model.families import POLLUX_FAMILY
from phalanx.errors import ConfigError, DataError

FORMAT = "phalanx-interference"
VERSION = 1
LEVELS = ("core", "server", "link", "device")

# a strategy's family: what it does to the machine (how its ranks talk and wait)
FAMILY = {"single": "single", "sync": "sync", "zero": "sync", "fsdp": "sync",
          "average": "avg", "bsp": "ps", "asp": "ps", "ssp": "ps", "softsync": "ps",
          "downpour": "ps", "dc-asgd": "ps", "sandblaster": "ps", "hogwild": "hogwild",
          "model-parallel": "pipe", "pipeline": "pipe", "hybrid": "pipe",
          "tensor": "tensor"}


def strategy_family(strategy: str) -> str:
    fam = FAMILY.get(strategy)
    if fam is None:
        raise ConfigError(f"interference: unknown strategy {strategy!r} "
                          f"(known: {', '.join(sorted(FAMILY))})")
    return fam


def job_class(model: str, strategy: str, workers: int) -> str:
    """The class name of a job: ``"{model}-{family}-{workers}"``."""
    return f"{model}-{strategy_family(strategy)}-{int(workers)}"


@dataclass(frozen=True)
class Pair:
    level: str
    a: str
    b: str
    kept_a: float
    kept_b: float
    repeats: int = 1
    kept_a_ci: tuple[float, float] | None = None
    kept_b_ci: tuple[float, float] | None = None


@dataclass
class PairTable:
    """Measured pairs, per level: ``kept[(level, a, b)]`` = a's rate beside b / alone."""

    classes: dict[str, dict] = field(default_factory=dict)
    pairs: list[Pair] = field(default_factory=list)
    source: str = ""

    def kept(self) -> dict[tuple[str, str, str], float]:
        out: dict[tuple[str, str, str], float] = {}
        for p in self.pairs:
            if p.a == p.b:       # two copies of one class: either side is the pair's
                out[(p.level, p.a, p.a)] = (p.kept_a + p.kept_b) / 2
                continue
            out[(p.level, p.a, p.b)] = p.kept_a
            out[(p.level, p.b, p.a)] = p.kept_b
        return out

    def levels(self) -> list[str]:
        return sorted({p.level for p in self.pairs}, key=LEVELS.index)

    def to_json(self) -> dict:
        rows = []
        for p in self.pairs:
            r = {"level": p.level, "a": p.a, "b": p.b, "kept_a": p.kept_a,
                 "kept_b": p.kept_b, "repeats": p.repeats}
            if p.kept_a_ci is not None:
                r["kept_a_ci"] = list(p.kept_a_ci)
            if p.kept_b_ci is not None:
                r["kept_b_ci"] = list(p.kept_b_ci)
            rows.append(r)
        return {"format": FORMAT, "version": VERSION, "source": self.source,
                "classes": self.classes, "pairs": rows}

    def save(self, path: Path) -> None:
        tmp = Path(str(path) + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        tmp.replace(path)


def _kept_value(v: object, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v <= 2.0):
        raise DataError(f"{what} must be a number in (0, 2], got {v!r}")
    return float(v)


def table_from_json(data: object, where: str = "interference table") -> PairTable:
    """A table from its JSON form, every field checked (a one-line error naming it)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DataError(f"{where}: not a phalanx interference table (format {FORMAT!r})")
    if data.get("version") != VERSION:
        raise DataError(f"{where}: version {data.get('version')!r} (this phalanx reads "
                        f"{VERSION})")
    classes = data.get("classes")
    if not isinstance(classes, dict) or not all(isinstance(k, str) and isinstance(v, dict)
                                                for k, v in classes.items()):
        raise DataError(f"{where}: 'classes' must map class names to objects")
    rows = data.get("pairs")
    if not isinstance(rows, list) or not rows:
        raise DataError(f"{where}: 'pairs' must be a non-empty list")
    pairs = []
    for i, r in enumerate(rows):
        w = f"{where}: pairs[{i}]"
        if not isinstance(r, dict):
            raise DataError(f"{w} must be an object")
        level = r.get("level")
        if level not in LEVELS:
            raise DataError(f"{w}.level must be one of {', '.join(LEVELS)}, got {level!r}")
        for side in ("a", "b"):
            if r.get(side) not in classes:
                raise DataError(f"{w}.{side} names no class of 'classes': {r.get(side)!r}")
        reps = r.get("repeats", 1)
        if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
            raise DataError(f"{w}.repeats must be an integer >= 1, got {reps!r}")
        cis = []
        for side in ("a", "b"):
            ci = r.get(f"kept_{side}_ci")
            if ci is not None:
                if not (isinstance(ci, list) and len(ci) == 2):
                    raise DataError(f"{w}.kept_{side}_ci must be [low, high]")
                ci = (_kept_value(ci[0], f"{w}.kept_{side}_ci[0]"),
                      _kept_value(ci[1], f"{w}.kept_{side}_ci[1]"))
            cis.append(ci)
        pairs.append(Pair(level, r["a"], r["b"], _kept_value(r.get("kept_a"), f"{w}.kept_a"),
                          _kept_value(r.get("kept_b"), f"{w}.kept_b"), reps, cis[0], cis[1]))
    return PairTable(dict(classes), pairs, str(data.get("source", "")))


def load_table(path: str | Path) -> PairTable:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise DataError(f"{p}: cannot read the interference table ({e.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{p}: not JSON at line {e.lineno}") from None
    return table_from_json(data, str(p))


def gavel_table(data_dir: str | Path, device: str = "v100") -> PairTable:
    """Gavel's published co-located pairs (two single-worker jobs on one ``device``), as
    level ``device`` rows; a class per Gavel model family x batch size entry is averaged
    to the family (``"{family}-single-1"``)."""
    path = Path(data_dir) / "gavel" / "simulation_throughputs.json"
    try:
        gavel = json.loads(path.read_text())[device]
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror}); set --data-dir") from None
    except (json.JSONDecodeError, KeyError):
        raise DataError(f"{path}: no {device!r} section of Gavel's throughputs") from None
    acc: dict[tuple[str, str], list[float]] = {}
    for key, entry in gavel.items():
        name, gang = ast.literal_eval(key)
        if int(gang) != 1 or not isinstance(entry, dict):
            continue
        iso = entry.get("null")
        if not isinstance(iso, (int, float)) or iso <= 0:
            continue
        fa = name.split(" (")[0]
        for k2, v in entry.items():
            if k2 == "null" or not isinstance(v, list) or not v or v[0] <= 0:
                continue
            other, g2 = ast.literal_eval(k2)
            if int(g2) != 1:
                continue
            acc.setdefault((fa, other.split(" (")[0]), []).append(min(v[0] / iso, 2.0))
    name = lambda f: f"{f.replace(' ', '_')}-single-1"  # noqa: E731
    classes = {name(f): {"model": f, "strategy": "single", "workers": 1}
               for f in sorted({a for a, _ in acc} | {b for _, b in acc})}
    pairs = []
    done = set()
    for (fa, fb), vals in sorted(acc.items()):
        if (fb, fa) in done or (fb, fa) not in acc:
            continue
        done.add((fa, fb))
        pairs.append(Pair("device", name(fa), name(fb), statistics.fmean(vals),
                          statistics.fmean(acc[(fb, fa)]), len(vals)))
    return PairTable(classes, pairs, f"Gavel's co-located pairs on {device} ({path.name})")


@dataclass(frozen=True)
class PairModel:
    """``kept(a, b) = 1 / (1 + s[a] * p[b])`` per level, fitted on measured pairs.

    ``sensitivity[level][a]``, ``pressure[level][b]`` >= 0. A class the fit never saw on
    one side takes that side's median (a new class is assumed typical, not harmless)."""

    sensitivity: Mapping[str, Mapping[str, float]]
    pressure: Mapping[str, Mapping[str, float]]

    def predict(self, a: str, b: str, level: str) -> float:
        s = self.sensitivity.get(level)
        p = self.pressure.get(level)
        if not s or not p:
            return 1.0
        sa = s.get(a, statistics.median(s.values()))
        pb = p.get(b, statistics.median(p.values()))
        return 1.0 / (1.0 + sa * pb)


def fit_pairs(observed: Mapping[tuple[str, str, str], float | Iterable[float]],
              iters: int = 200) -> PairModel:
    """Fit :class:`PairModel` on ``{(level, a, b): kept}`` (a value or several). Alternating
    non-negative least squares on ``y = 1/kept - 1 = s_a * p_b`` (each observation weighted
    alike), per level; the scale between s and p is fixed by ``median(p) = 1``."""
    sens: dict[str, dict[str, float]] = {}
    pres: dict[str, dict[str, float]] = {}
    by_level: dict[str, list[tuple[str, str, float]]] = {}
    for (level, a, b), v in observed.items():
        vals = [v] if isinstance(v, (int, float)) else list(v)
        for x in vals:
            if not (x > 0 and math.isfinite(x)):
                continue
            by_level.setdefault(level, []).append((a, b, max(0.0, 1.0 / x - 1.0)))
    for level, obs in by_level.items():
        s = {a: 0.5 for a, _, _ in obs}
        p = {b: 1.0 for _, b, _ in obs}
        for _ in range(iters):
            # s_a = sum(y p_b) / sum(p_b^2) over a's observations, then p likewise
            num: dict[str, float] = {}
            den: dict[str, float] = {}
            for a, b, y in obs:
                num[a] = num.get(a, 0.0) + y * p[b]
                den[a] = den.get(a, 0.0) + p[b] * p[b]
            s = {a: max(0.0, num[a] / den[a]) if den[a] > 0 else 0.0 for a in s}
            num, den = {}, {}
            for a, b, y in obs:
                num[b] = num.get(b, 0.0) + y * s[a]
                den[b] = den.get(b, 0.0) + s[a] * s[a]
            p = {b: max(0.0, num[b] / den[b]) if den[b] > 0 else 0.0 for b in p}
            mid = statistics.median(p.values())
            if mid > 0:
                p = {b: v / mid for b, v in p.items()}
                s = {a: v * mid for a, v in s.items()}
        sens[level], pres[level] = s, p
    return PairModel(sens, pres)


def held_out_errors(table: PairTable) -> list[dict]:
    """Each measured ordered pair predicted by a model fitted without that unordered pair
    (both its sides): ``{"level", "a", "b", "measured", "predicted", "error"}``, error =
    |predicted - measured| / measured."""
    kept = table.kept()
    out = []
    fits: dict[tuple[str, frozenset[str]], PairModel] = {}   # both sides share one fit
    for (level, a, b), y in sorted(kept.items()):
        pair = (level, frozenset((a, b)))
        if pair not in fits:
            fits[pair] = fit_pairs({k: v for k, v in kept.items()
                                    if (k[0], frozenset(k[1:])) != pair})
        pred = fits[pair].predict(a, b, level)
        out.append({"level": level, "a": a, "b": b, "measured": y, "predicted": pred,
                    "error": abs(pred - y) / y})
    return out


def kind_of(model: str, kind: str = "") -> str:
    """A simulated or live job's class: its own (``JobSpec.kind``, a live job's
    model-family-workers) or, for a trace's job, its Gavel family's single-worker class
    (a Pollux application borrows its family's, as its figures do)."""
    if kind:
        return kind
    return f"{POLLUX_FAMILY.get(model, model).replace(' ', '_')}-single-1"


class CoLocation:
    """What a neighbour costs a job, from a pair table: the perf model's interference and
    the ``interference`` placement read it alike.

    Two ways to read a table:

    * measured levels (``core``, ``server``): each neighbour job that shares one of the
      job's PCIe switches (a core, on a live cluster whose switches are pinned to cores)
      adds ``1/kept(a, b, core) - 1`` to the job's load, each other neighbour on its
      server ``1/kept(a, b, server) - 1``, as two jobs time-sharing a core add their
      demands; rate = solo / (1 + load);
    * Gavel's ``device`` level (two jobs on one GPU): the per-pair ``1/kept - 1`` replaces
      the family sensitivity of the fixed-weight model, neighbours weighted as before by
      their share of the switch (``k_switch``) and of the rest of the server
      (``k_server``): the weights stay assumptions, the pairs are measured.

    A pair the table lacks is predicted by :class:`PairModel` fitted on the table."""

    def __init__(self, table: PairTable, k_switch: float = 0.3, k_server: float = 0.1) -> None:
        self.k_switch, self.k_server = k_switch, k_server
        self.use(table)

    def use(self, table: PairTable) -> None:
        """Price by ``table`` from now on (its pairs, the pair model fitted on them)."""
        self.table = table
        self.measured = table.kept()
        self.model = fit_pairs(self.measured)
        self.levels = set(table.levels())
        self.per_device = not (self.levels & {"core", "server", "link"})
        self._x: dict[tuple[str, str, str], float] = {}

    def refresh(self) -> None:
        """Re-read what it learns from (a live schedule's, live/colocation.py); a table
        read once has nothing to re-read."""

    def kept(self, a: str, b: str, level: str) -> float:
        v = self.measured.get((level, a, b))
        return v if v is not None else self.model.predict(a, b, level)

    def x(self, a: str, b: str, level: str) -> float:
        """``1/kept - 1``: the load ``b`` adds to ``a`` at ``level`` (>= 0)."""
        key = (level, a, b)
        v = self._x.get(key)
        if v is None:
            if not self.per_device and level not in self.levels:
                v = 0.0    # a level the table never measured: no cost claimed
            else:
                v = max(0.0, 1.0 / self.kept(a, b, level) - 1.0)
            self._x[key] = v
        return v

    def load(self, a: str, neighbours: Iterable[tuple[str, int, int]], switch_cap: int,
             server_size: int) -> float:
        """Job ``a``'s load on one server from its ``neighbours``: (class, devices on the
        job's switches, devices elsewhere on the server) each."""
        total = 0.0
        for b, on_switch, rest in neighbours:
            if self.per_device:
                w = self.k_switch * on_switch / switch_cap + self.k_server * rest / server_size
                total += self.x(a, b, "device") * w
            elif on_switch:
                total += self.x(a, b, "core")
            elif rest:
                total += self.x(a, b, "server")
        return total

    def link_load(self, a: str, across: Iterable[str]) -> float:
        """Job ``a``'s load on the links between its servers (``a`` spans servers) from
        ``across``: the classes of the other jobs that span servers and share one of
        a's (each once). 0 without a measured ``link`` level: no cost claimed."""
        if "link" not in self.levels:
            return 0.0
        return sum(self.x(a, b, "link") for b in across)


def load_pairs(source: str, data_dir: str | Path) -> PairTable:
    """``--interference-pairs``' table: ``gavel`` (Gavel's pairs) or an
    ``interference.json`` path."""
    return gavel_table(data_dir) if source == "gavel" else load_table(source)


def co_location(source: str, data_dir: str | Path, k_switch: float = 0.3,
                k_server: float = 0.1) -> CoLocation | None:
    """``--interference-pairs``: '' (none: the family-sensitivity model) or a table's
    source (:func:`load_pairs`)."""
    return CoLocation(load_pairs(source, data_dir), k_switch, k_server) if source else None
