"""Bounds that every run setting must respect, whether it came from a flag, a config file
or ``phalanx.train(...)``: finite numbers, integers that fit the C types they end up in,
and sizes the machine can hold. Also :func:`short`, the only way a user-supplied value may
appear in an error message (a YAML alias bomb is a tiny file whose repr is gigabytes).
"""

from __future__ import annotations

import dataclasses
import math
import os
import reprlib
from typing import Any

from phalanx.errors import ConfigError

MAX_SEED = 2**32 - 1  # seeds are multiplied (seed * 1_000_003 + epoch) into 64-bit generators
MAX_SLOW_FACTOR = 1000.0

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlevel = 2


def memory_bytes() -> int:
    """Physical memory of this machine (a generous guess where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def available_memory_bytes() -> int:
    """Memory the kernel can give without swapping (``MemAvailable``), else physical."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return memory_bytes()


def short(value: Any) -> str:
    """A bounded repr of a user value for error messages (at most ~120 characters, even for
    a deeply nested or self-referential structure)."""
    text = _repr.repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_ranges(cfg: Any) -> None:
    """Every numeric field of a RunConfig is finite and within the ``limit`` its
    declaration gives (one-line ConfigError naming the flag otherwise)."""
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if isinstance(v, bool) or v is None:
            continue
        limit = f.metadata.get("limit")  # the field's own (config.setting(limit=...))
        if isinstance(v, float):
            if not math.isfinite(v):
                raise ConfigError(f"{_flag(f.name)}: {v} must be a finite number")
            if limit is None:
                continue
            low, high = limit
            if abs(v) > high:
                raise ConfigError(f"{_flag(f.name)}: {v:g} is out of range (at most {high:g})")
            if low > 0 and v < low:  # a process that would spin (a heartbeat every ns)
                raise ConfigError(f"{_flag(f.name)}: {v:g} is too small (at least {low:g})")
        elif isinstance(v, int):
            low, high = limit or (-(2**63), 2**63 - 1)
            if not low <= v <= high:
                raise ConfigError(f"{_flag(f.name)}: {short(v)} is out of range "
                                  f"({low}..{high})")
    for rank, factor in cfg.slow_workers.items():
        if not (isinstance(rank, int) and 0 <= rank < 2**31):
            raise ConfigError(f"--slow-workers: rank {short(rank)} is not a rank >= 0")
        if not (isinstance(factor, float) and math.isfinite(factor)
                and 1.0 <= factor <= MAX_SLOW_FACTOR):
            raise ConfigError(f"--slow-workers: factor {short(factor)} for rank {rank} must be "
                              f"in 1..{MAX_SLOW_FACTOR:g}")
