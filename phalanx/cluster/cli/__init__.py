"""The scheduler's commands: ``phalanx simulate`` and ``phalanx schedule``."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable

from phalanx.errors import ConfigError

ROUND_ORDERINGS = ("las", "tiresias", "rr")  # the orderings that read --slot
LOAD_ADAPTIVE = ("load-adaptive", "load-adaptive-demand")  # placements reading --threshold


def remember_defaults(p: argparse.ArgumentParser) -> None:
    """Keep each flag's default on the parsed namespace, so a command can tell a flag the
    user gave from one left alone (:func:`refuse_unread`)."""
    p.set_defaults(flag_defaults={a.dest: a.default for a in p._actions
                                  if a.dest != "help"})


def given(args: argparse.Namespace, dest: str) -> bool:
    """Did the user give ``--dest`` (its value differs from the flag's default)?"""
    return getattr(args, dest) != args.flag_defaults.get(dest)


def refuse_unread(args: argparse.Namespace,
                  readers: Iterable[tuple[str, Callable[[], bool], str]]) -> None:
    """A flag the chosen policy, placement or engine would not read is an error, not
    silently ignored: ``readers`` lists (flag dest, whether it is read, who reads it)."""
    for dest, is_read, who in readers:
        if given(args, dest) and not is_read():
            raise ConfigError(f"--{dest.replace('_', '-')}: {who}; drop it")


def read_by(chosen: set[str], names: Iterable[str],
            flag: str = "--policy") -> tuple[Callable[[], bool], str]:
    """(whether any of the ``chosen`` policies / placements is one of ``names``, the
    message naming who reads the flag): one entry of :func:`refuse_unread`."""
    names = tuple(names)
    return (lambda: bool(chosen & set(names)),
            f"{flag} {', '.join(sorted(chosen))} does not use it (only {', '.join(names)})")
