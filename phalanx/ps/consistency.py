"""Consistency models: when may a worker start its next iteration, and when does a shard
apply the pushes it has buffered.

A worker's *clock* is the number of pushes it has completed. Every model answers two
questions with one interface, so one conformance suite checks them all:

* :meth:`Consistency.admits` — may a worker at ``clock`` receive parameters (start its next
  iteration) while the slowest active worker is at ``slowest``?
* :meth:`Consistency.ready` — should the shard apply its buffer now, given which workers
  the buffered pushes came from and which workers are still active?

| model          | admits                  | ready (apply the buffer's average)           |
|----------------|-------------------------|----------------------------------------------|
| BSP            | clock <= slowest        | every active worker has pushed (a barrier)   |
| ASP            | always                  | at once (one push)                           |
| SSP(s)         | clock - slowest <= s    | at once (one push)                           |
| SoftSync(n)    | always                  | min(n, live workers) pushes buffered         |

Each model is one class plus one line in :data:`MODELS`; ``--consistency NAME`` picks it
(the parameter-server strategies are presets that name one, docs/parameter-server.md).
A class names the settings it reads (``options``) and builds itself from a RunConfig.

When no worker is active any more the shard flushes whatever is left in its buffer.
``active`` holds the live workers only: a worker that died is dropped from it, so BSP's
barrier, SSP's slowest clock and SoftSync's n all count the survivors.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from typing import Any

from phalanx.errors import ConfigError


class Consistency(ABC):
    name = "consistency"
    options: tuple[str, ...] = ()  # RunConfig settings this model reads
    # a worker may ask for its next weights before it pushes this step's gradient (the
    # pull overlaps its compute; the weights it trains on are one push older). Only where
    # no bound or barrier is defined on the clocks, so BSP / SSP / SoftSync keep theirs
    pulls_ahead = False

    @abstractmethod
    def admits(self, clock: int, slowest: int) -> bool: ...

    @abstractmethod
    def ready(self, pushed_by: Sequence[int], active: Collection[int]) -> bool: ...

    @classmethod
    def from_config(cls, cfg: Any) -> Consistency:
        """The model with its settings taken from a RunConfig."""
        return cls()

    def updates(self, workers: int, pushes: int) -> int:
        """How many updates a shard applies when each of ``workers`` sends ``pushes``
        pushes (the horizon of an lr schedule): one per push unless the model averages."""
        return workers * pushes

    def __repr__(self) -> str:
        return self.name


class BulkSynchronous(Consistency):
    """BSP: a barrier over all workers each iteration; the N gradients of one iteration are
    averaged into one update, so N workers with batch b are SGD with batch N*b."""

    name = "bsp"

    def admits(self, clock: int, slowest: int) -> bool:
        return clock <= slowest

    def ready(self, pushed_by: Sequence[int], active: Collection[int]) -> bool:
        return bool(pushed_by) and set(active) <= set(pushed_by)

    def updates(self, workers: int, pushes: int) -> int:
        return pushes  # one averaged update per iteration


class Asynchronous(Consistency):
    """ASP: no waiting; every push is applied the moment it arrives."""

    name = "asp"
    # pushes arrive stale: --staleness-lr divides each by its staleness (BSP's are never)
    options = ("staleness_lr",)
    pulls_ahead = True

    def admits(self, clock: int, slowest: int) -> bool:
        return True

    def ready(self, pushed_by: Sequence[int], active: Collection[int]) -> bool:
        return len(pushed_by) >= 1


class StaleSynchronous(Consistency):
    """SSP(s): pushes apply at once, but a worker at clock c waits until the slowest worker
    is at clock >= c - s. s = 0 is a barrier; s = infinity is ASP."""

    options = ("staleness", "staleness_lr")

    def __init__(self, bound: int) -> None:
        if bound < 0:
            raise ValueError("SSP bound must be >= 0")
        self.bound = bound
        self.name = f"ssp({bound})"

    @classmethod
    def from_config(cls, cfg: Any) -> Consistency:
        return cls(cfg.staleness)

    def admits(self, clock: int, slowest: int) -> bool:
        return clock - slowest <= self.bound

    def ready(self, pushed_by: Sequence[int], active: Collection[int]) -> bool:
        return len(pushed_by) >= 1


class SoftSynchronous(Consistency):
    """SoftSync(n): apply the average of every n pushes, whoever sent them.

    (Zhang et al. 2016 write n-softsync with c = floor(N / n) gradients per update; our n
    is their c: n = 1 is ASP, n = N is the sync-like end.)"""

    options = ("softsync", "staleness_lr")

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError("SoftSync n must be >= 1")
        self.n = n
        self.name = f"softsync({n})"

    @classmethod
    def from_config(cls, cfg: Any) -> Consistency:
        return cls(cfg.softsync)

    def updates(self, workers: int, pushes: int) -> int:
        return math.ceil(workers * pushes / self.n)

    def admits(self, clock: int, slowest: int) -> bool:
        return True

    def ready(self, pushed_by: Sequence[int], active: Collection[int]) -> bool:
        # capped at the live workers: with fewer than n left, n pushes would never come
        return bool(pushed_by) and len(pushed_by) >= min(self.n, len(active))


# --consistency NAME -> its model: the one place a new model is listed
MODELS: dict[str, type[Consistency]] = {
    "bsp": BulkSynchronous,
    "asp": Asynchronous,
    "ssp": StaleSynchronous,
    "softsync": SoftSynchronous,
}


def model_class(name: str) -> type[Consistency]:
    if name not in MODELS:
        raise ConfigError(f"--consistency: {name!r} is not one of {', '.join(MODELS)}")
    return MODELS[name]


def make_consistency(name: str, cfg: Any) -> Consistency:
    """The consistency model ``name`` with its settings from ``cfg``."""
    return model_class(name).from_config(cfg)
