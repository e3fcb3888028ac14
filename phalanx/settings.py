"""How one run setting is declared (:func:`setting`: its help, section, rule, limit and
needs), the value types a few settings parse into (:class:`Device`, ``--slow-workers``),
and :data:`SECTIONS`. :mod:`phalanx.config` declares every field with them."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from phalanx.errors import ConfigError

SECTIONS = {  # a setting's section -> what it holds (``--help`` groups the flags by it)
    "run": "the run as a whole",
    "data": "the data set and its shards",
    "model": "the model",
    "optim": "the optimiser: rule, learning rate, schedule, batches",
    "parallel": "strategy, workers and placement",
    "faults": "injected faults and stragglers",
    "comm": "communication and compression",
    "ps": "parameter server (bsp, asp, ssp, softsync, downpour, dc-asgd)",
    "average": "parameter averaging and DiLoCo",
    "stages": "model parallel, pipeline and hybrid",
    "hogwild": "Hogwild!",
    "sandblaster": "Sandblaster L-BFGS",
    "output": "the run folder, events and checkpoints",
}


@dataclass(frozen=True)
class Range:
    """The values a number may take, and the sentence that says so when it does not.
    Integers with both ends are ``lo..hi``; otherwise ``> lo``, ``>= lo``, ``in [lo, hi)``."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    text: str = ""

    def holds(self, v: float) -> bool:
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        return self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)

    def says(self) -> str:
        if self.text:
            return self.text
        if self.hi is None:
            return f"must be {'>' if self.lo_open else '>='} {self.lo:g}"
        if not (self.lo_open or self.hi_open) and isinstance(self.lo, int) and \
                isinstance(self.hi, int):
            return f"must be in {self.lo:g}..{self.hi:g}"
        return (f"must be in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}"
                f"{')' if self.hi_open else ']'}")


def setting(default: Any = dataclasses.MISSING, help: str = "", *,
            factory: Any = None, choices: tuple[str, ...] = (), section: str = "run",
            rule: Range | None = None, limit: tuple[float, float] | None = None,
            needs: tuple[str, Callable[[Any], bool]] | None = None) -> Any:
    """A :class:`RunConfig` field and everything about it, in one place:

    - ``help`` and ``choices``: ``phalanx.entry.flags`` builds the flag's ``--help`` from
      them (with the default);
    - ``section``: which part of a run it configures (:data:`SECTIONS`);
    - ``rule``: the values it may take (:meth:`RunConfig.validate` checks every field's);
    - ``limit``: (low, high) beyond which a value is a typo, not a plan (seeds that fit
      64-bit generators, counts that fit C types, sizes the machine can hold);
      :func:`phalanx.limits.check_ranges` reads it;
    - ``needs``: (what, is_read): it is read only beside another setting's value (``--gamma``
      with ``--schedule step``); a non-default value without it is refused.

    Which *strategies* read a setting is declared by their specs' ``options``, so a new
    strategy stays one module (docs/architecture.md)."""
    if section not in SECTIONS:
        raise ValueError(f"setting: unknown section {section!r}")
    meta = {"help": help, "choices": choices, "section": section, "rule": rule,
            "limit": limit, "needs": needs}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def parse_slow_workers(text: str) -> dict[int, float]:
    """``"0:3.0,2:1.5"`` -> ``{0: 3.0, 2: 1.5}`` (rank -> slowdown factor >= 1)."""
    out: dict[int, float] = {}
    if not text:
        return out
    for item in text.split(","):
        rank_s, sep, factor_s = item.strip().partition(":")
        try:
            rank, factor = int(rank_s), float(factor_s)
        except ValueError:
            raise ConfigError(f"--slow-workers: {item!r} is not RANK:FACTOR (e.g. 0:3.0)") from None
        if not sep or rank < 0 or not math.isfinite(factor) or factor < 1.0:
            raise ConfigError(f"--slow-workers: {item!r} needs a rank >= 0 and a factor >= 1")
        out[rank] = factor
    return out


class Device(NamedTuple):
    """``--device`` parsed: ``kind`` cpu or cuda, ``index`` K of ``cuda:K`` (None: each
    rank takes a GPU of its own)."""

    kind: str
    index: int | None = None

    def __str__(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


def parse_device(device: str | Device) -> Device:
    """``"cpu"`` -> (cpu, None); ``"cuda"`` -> (cuda, None); ``"cuda:K"`` -> (cuda, K)."""
    if isinstance(device, Device):
        return device
    kind, sep, index = device.partition(":")
    if kind == "cpu" and not sep:
        return Device("cpu")
    if kind == "cuda" and not sep:
        return Device("cuda")
    if kind == "cuda" and index.isdigit():
        return Device("cuda", int(index))
    raise ConfigError(f"--device: {device!r} is not one of cpu, cuda, cuda:K")
