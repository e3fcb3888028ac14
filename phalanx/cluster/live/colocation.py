"""Interference measured while a live schedule runs: each job's throughput with the jobs
that shared its PCIe switch (its pinned core, under ``--pin-cores``) and its server, read
from the schedule's own files, and the pair table learned from them.

Where it reads:

* ``scheduler-state.json``: each job's placements (devices) and stops on the scheduler's
  clock, with ``unix``, the wall time at ``clock`` (state.py), so the clock maps onto the
  jobs' own;
* each job's ``jobs/NAME/events.jsonl``: its ranks' ``train`` events (cumulative
  ``samples`` at ``unix`` time, every few steps).

A *context* is what a job shares over a span of time: the classes of the jobs on its
switches (level ``core``) and of the other jobs on its servers (level ``server``), and,
when the schedule's servers are separate machines (``links``: an existing Ray or Slurm
cluster), for a job across servers the classes of the other jobs across servers that
share one of its servers (level ``link``: their ranks send over the same servers' links).
On one machine (the local engine, a Ray cluster started for the run) a job's ranks on
different "servers" talk over the loopback: there is no link to share, and no link level
is learned. Each pair of a rank's consecutive ``train`` events whose span lies inside one
context (no neighbour came or went, and none was still starting: from its placement to its
ranks' first ``train`` events it is neither beside the job nor not) adds its samples and
seconds to that context; the first ``WARMUP`` spans of each start are start-up, not rate.
A job's rate in a context is the sum over its ranks of samples / seconds.

The learned table (:func:`learn`): a class's solo rate is its rate in the empty context
(all its jobs' alone time pooled; else the prior table's ``solo``). Every other context of
at least ``MIN_S`` seconds gives one equation, ``solo / rate - 1 = the sum of its
neighbours' loads`` (time-sharing adds demands), and each class's load from each neighbour
(class, level) is their least-squares solution weighted by seconds and pulled toward the
prior's load by ``PRIOR_S`` seconds' worth (:func:`_fit_class`), with a 95% interval:
``kept = 1 / (1 + load)``. A neighbour that shared a job's servers in exactly the contexts
where it shared their links (two jobs across the same servers) has its whole load at level
``link``: no schedule of them tells the two apart, and the profiler's link level is
measured the same way. A pair whose other side was not learned takes the prior's (else
this side's) for it.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from phalanx.cluster.core.topology import Topology
from phalanx.cluster.live.observe import EventTail
from phalanx.cluster.model.interference import CoLocation, Pair, PairTable

WARMUP = 2          # train-event spans skipped after each start (start-up, first steps)
MIN_S = 2.0         # seconds of a context before its rate counts
PRIOR_S = 5.0       # the prior table's load counts as this many seconds of observation
STATE = "scheduler-state.json"


@dataclass
class Context:
    """One job in one context: samples and seconds per rank."""

    samples: dict[int, float] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)

    def add(self, rank: int, samples: float, seconds: float) -> None:
        self.samples[rank] = self.samples.get(rank, 0.0) + samples
        self.seconds[rank] = self.seconds.get(rank, 0.0) + seconds

    @property
    def span(self) -> float:
        return max(self.seconds.values(), default=0.0)

    @property
    def rate(self) -> float:
        return sum(self.samples[r] / s for r, s in self.seconds.items() if s > 0)


# the neighbour classes at each level observed, each sorted: (core, server), and link when
# the servers are separate machines
Key = tuple[tuple[str, ...], ...]
LEVELS_OBSERVED = ("core", "server", "link")


def _intervals(fields: Mapping, clock_end: float) -> list[tuple[float, float, tuple[int, ...]]]:
    """(from, to, devices) of each start, on the scheduler's clock."""
    stops = list(fields.get("stops", []))
    out = []
    placements = fields.get("placements", [])
    end = fields.get("end", -1)
    for i, (t, devs) in enumerate(placements):
        if i < len(stops):
            to = stops[i]
        elif i + 1 < len(placements):
            to = placements[i + 1][0]
        else:
            to = end if isinstance(end, (int, float)) and end >= 0 else clock_end
        out.append((float(t), float(to), tuple(devs)))
    return out


class TrainEvents:
    """Each job's ``train`` events per rank: (unix, cumulative samples), read as the files
    grow (:class:`EventTail`: only the lines appended since the last read are parsed, so a
    live schedule's refresh does not re-read its jobs' whole histories)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.tails: dict[str, EventTail] = {}
        self.points: dict[str, dict[int, list[tuple[float, float]]]] = {}

    def of(self, name: str) -> dict[int, list[tuple[float, float]]]:
        tail = self.tails.get(name)
        if tail is None:
            tail = self.tails[name] = EventTail(self.out / "jobs" / name / "events.jsonl")
        points = self.points.setdefault(name, {})
        for rec in tail.new():
            if rec.get("kind") != "train":
                continue
            u, n, r = rec.get("unix"), rec.get("samples"), rec.get("rank", -1)
            if isinstance(u, (int, float)) and isinstance(n, (int, float)) and \
                    isinstance(r, int):
                points.setdefault(r, []).append((float(u), float(n)))
        return points


def observe(out: Path, topology: Topology, kinds: Mapping[str, str],
            events: TrainEvents | None = None, links: bool = False
            ) -> dict[str, dict[Key, Context]]:
    """Per job (by name): its contexts, from the schedule folder ``out``; ``kinds`` maps
    job names to their classes; ``events``: a reader kept between calls (a live refresh);
    ``links``: the servers are separate machines (a context then has a link level). A
    schedule with no state yet gives nothing."""
    try:
        state = json.loads((out / STATE).read_text())
        jobs, clock, unix = state["jobs"], float(state["clock"]), float(state["unix"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    anchor = unix - clock          # wall time at the scheduler's clock 0
    events = events or TrainEvents(out)
    t = topology
    spans = {name: [(anchor + a, anchor + b, devs) for a, b, devs in
                    _intervals(j.get("fields", {}), clock)]
             for name, j in jobs.items() if isinstance(j, dict)}
    series = {name: events.of(name) for name in spans}
    for pts in (p for ranks in series.values() for p in ranks.values()):
        pts.sort()

    def settled(name: str, a: float, b: float) -> float:
        """When the start [a, b] of ``name`` had every rank training (its ranks' first
        ``train`` events in it): before that it was starting up (imports, its group) and
        took no link, a neighbour or not. A start with no train event counts from a."""
        firsts = [next((u for u, _ in pts if a <= u <= b), None)
                  for pts in series[name].values()]
        return max((u for u in firsts if u is not None), default=a)

    ready = {name: [settled(name, a, b) for a, b, _ in iv] for name, iv in spans.items()}

    def context(name: str, u0: float, u1: float) -> Key | None:
        """Who shared ``name``'s switches / servers over [u0, u1]; None if it changed."""
        mine = [devs for a, b, devs in spans[name] if a <= u0 and u1 <= b]
        if not mine:
            return None
        devs = mine[0]
        my_sw = {t.device_switch[d] for d in devs}
        my_srv = {t.device_server[d] for d in devs}
        core, server, link = [], [], []
        for other, iv in spans.items():
            if other == name:
                continue
            for (a, b, odevs), up in zip(iv, ready[other]):
                if b <= u0 or a >= u1:
                    continue
                if not (a <= u0 and u1 <= b):
                    return None       # it came or went inside the span
                kind = kinds.get(other, other)
                if any(t.device_switch[d] in my_sw for d in odevs):
                    core.append(kind)
                elif any(t.device_server[d] in my_srv for d in odevs):
                    server.append(kind)
                else:
                    continue          # it shares nothing with ``name``
                if u0 < up:
                    return None       # a neighbour still starting: neither beside it nor not
                o_srv = {t.device_server[d] for d in odevs}
                if links and len(my_srv) > 1 and len(o_srv) > 1 and o_srv & my_srv:
                    link.append(kind)
        key = (tuple(sorted(core)), tuple(sorted(server)))
        return (*key, tuple(sorted(link))) if links else key

    result: dict[str, dict[Key, Context]] = {}
    for name in spans:
        ctxs: dict[Key, Context] = {}
        for rank, pts in series[name].items():
            since_start = 0
            for (u0, n0), (u1, n1) in zip(pts, pts[1:]):
                if n1 <= n0 or u1 <= u0:
                    since_start = 0      # a new start (samples counted anew) or a tie
                    continue
                since_start += 1
                if since_start <= WARMUP:
                    continue
                # a stop and restart between the two events: no single start holds both
                key = context(name, u0, u1)
                if key is None:
                    continue
                ctxs.setdefault(key, Context()).add(rank, n1 - n0, u1 - u0)
        if ctxs:
            result[name] = ctxs
    return result


def learn(observed: Mapping[str, Mapping[Key, Context]], kinds: Mapping[str, str],
          source: str = "", prior: CoLocation | None = None) -> PairTable | None:
    """The pair table of what ``observed`` holds (see the module doc); None when nothing
    could be learned (no class with a solo rate was seen beside another)."""
    solo_obs: dict[str, list[tuple[float, float]]] = {}
    beside: dict[str, list[tuple[Key, float, float]]] = {}   # class -> (key, rate, span)
    for name, ctxs in observed.items():
        a = kinds.get(name, name)
        for key, c in ctxs.items():
            if c.span < MIN_S or c.rate <= 0:
                continue
            if not any(key):
                solo_obs.setdefault(a, []).append((c.rate, c.span))
            else:
                beside.setdefault(a, []).append((key, c.rate, c.span))
    solo = {a: sum(r * w for r, w in v) / sum(w for _, w in v) for a, v in solo_obs.items()}
    if prior is not None:       # a class never alone here: its solo rate from the table
        for a, info in prior.table.classes.items():
            if a not in solo and isinstance(info.get("solo"), (int, float)) and \
                    info["solo"] > 0:
                solo[a] = float(info["solo"])
    learned: dict[tuple[str, str, str], tuple[float, float, float, int]] = {}
    for a, rows in beside.items():
        if a in solo:
            learned.update(_fit_class(a, solo[a], rows, prior))
    if not learned:
        return None
    pairs, done = [], set()
    for (level, a, b), (x, lo, hi, n) in sorted(learned.items()):
        if (level, a, b) in done:
            continue
        done |= {(level, a, b), (level, b, a)}
        other = learned.get((level, b, a))
        if other is None:       # b's side not seen: the prior's, else the same as a's
            kb = prior.kept(b, a, level) if prior is not None else 1 / (1 + x)
            cb = (kb, kb)
        else:
            kb, cb = 1 / (1 + other[0]), (1 / (1 + other[2]), 1 / (1 + other[1]))
        pairs.append(Pair(level, a, b, 1 / (1 + x), kb, n, (1 / (1 + hi), 1 / (1 + lo)), cb))
    classes = {k: {"solo": round(v, 3)} for k, v in solo.items()}
    for p in pairs:
        classes.setdefault(p.a, {})
        classes.setdefault(p.b, {})
    return PairTable(classes, pairs, source or "learned from a live schedule")


def _fit_class(a: str, solo: float, rows: list[tuple[Key, float, float]],
               prior: CoLocation | None) -> dict[tuple[str, str, str], tuple]:
    """Class ``a``'s load from each neighbour (class, level): every context gives
    ``solo / rate - 1 = sum of its neighbours' loads`` (as time-sharing adds demands);
    least squares weighted by the context's seconds, pulled toward the prior's load by
    ``PRIOR_S`` seconds' worth (toward 0 by ``0.1 s`` without a prior). Returns
    ``{(level, a, b): (load, low, high, contexts)}`` with a 95% interval from the
    residuals, for each neighbour seen."""
    counts = [Counter((lvl, b) for lvl, bs in zip(LEVELS_OBSERVED, key) for b in bs)
              for key, _, _ in rows]
    feats = sorted({f for c in counts for f in c})
    # a neighbour that shared a's servers and their links in every context where it did
    # either (two jobs across the same servers share both): the rows cannot tell the two
    # loads apart, and least squares would split their sum by its penalty alone (evenly
    # without a prior). The whole load goes to level link, as the profiler measures that
    # level (two jobs across the same hosts: the hosts' sharing is in it)
    feats = [(lvl, b) for lvl, b in feats if lvl == "link" or ("link", b) not in feats
             or any(c[(lvl, b)] != c[("link", b)] for c in counts)]
    index = {f: i for i, f in enumerate(feats)}
    A = np.zeros((len(rows), len(feats)))
    y = np.zeros(len(rows))
    w = np.zeros(len(rows))
    for i, (c, (_, rate, span)) in enumerate(zip(counts, rows)):
        for f, k in c.items():
            if f in index:
                A[i, index[f]] = k
        y[i] = max(0.0, solo / rate - 1.0)
        w[i] = span
    lam = PRIOR_S if prior is not None else 0.1
    x0 = np.array([max(0.0, 1 / prior.kept(a, b, lvl) - 1) if prior is not None else 0.0
                   for lvl, b in feats])
    H = A.T @ (w[:, None] * A) + lam * np.eye(len(feats))
    x = np.linalg.solve(H, A.T @ (w * y) + lam * x0)
    x = np.maximum(x, 0.0)
    resid = y - A @ x
    var = float(np.sum(w * resid ** 2) / max(np.sum(w), 1e-9))
    half = 1.96 * np.sqrt(np.maximum(np.diag(np.linalg.inv(H)) * max(var, 1e-6)
                                     * np.sum(w) / max(len(rows), 1), 0.0))
    contexts = (A > 0).sum(axis=0)
    return {(lvl, a, b): (float(x[j]), float(max(0.0, x[j] - half[j])),
                          float(x[j] + half[j]), int(contexts[j]))
            for (lvl, b), j in index.items()}


def merged(prior: PairTable | None, learned: PairTable | None) -> PairTable | None:
    """``learned``'s pairs over ``prior``'s (a pair measured live replaces the prior's)."""
    if prior is None or learned is None:
        return learned or prior
    mine = {(p.level, frozenset((p.a, p.b))) for p in learned.pairs}
    keep = [p for p in prior.pairs if (p.level, frozenset((p.a, p.b))) not in mine]
    classes = {**prior.classes, **learned.classes}
    return PairTable(classes, keep + learned.pairs,
                     f"{learned.source}; else {prior.source}")


class LiveCoLocation(CoLocation):
    """A :class:`CoLocation` that learns as the schedule runs: at most every
    ``refresh_s`` seconds it re-reads the schedule folder and refits on the prior table
    merged with what it measured (the ``interference`` placement calls :meth:`refresh`
    before it weighs a placement)."""

    def __init__(self, prior: PairTable | None, out: Path, topology: Topology,
                 kinds: Mapping[str, str], refresh_s: float = 10.0,
                 links: bool = False) -> None:
        self.prior, self.out, self.topology = prior, out, topology
        self.links = links      # the servers are separate machines: learn level link
        self.kinds = dict(kinds)
        self.refresh_s = refresh_s
        self._at = -float("inf")
        self.learned: PairTable | None = None
        base = prior or PairTable({}, [Pair("core", "-", "-", 1.0, 1.0)], "nothing yet")
        super().__init__(base)
        self._prior_co = CoLocation(prior) if prior is not None else None
        self.events = TrainEvents(out)

    def refresh(self) -> None:
        now = time.monotonic()
        if now - self._at < self.refresh_s:
            return
        self._at = now
        learned = learn(observe(self.out, self.topology, self.kinds, self.events,
                                self.links), self.kinds, prior=self._prior_co)
        if learned is None or (self.learned is not None and
                               learned.pairs == self.learned.pairs):
            return
        self.learned = learned
        table = merged(self.prior, learned)
        if table is not None:
            self.use(table)
