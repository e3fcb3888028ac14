"""The run-configuration flags: one flag per :class:`~phalanx.config.RunConfig` field,
shared by ``phalanx train``, ``phalanx compare``, the experiments and the ``torchrun`` entry.

Every user error (bad flag, bad value, bad file) is one line ``phalanx: error: ...`` and
exit 2; nothing prints a traceback for it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from phalanx.comm.compress import CODECS
from phalanx.config import SECTIONS, RunConfig, load_config_file, parse_slow_workers
from phalanx.data import DATASETS
from phalanx.errors import ConfigError
from phalanx.models import MODELS as MODEL_NAMES
from phalanx.parallel.registry import NAMES, check_config, option_owners
from phalanx.ps.consistency import MODELS
from phalanx.rules import RULES, SCHEDULES


# choices that live in registries above the config layer (the config's own tuples are in
# each field's metadata)
def _registry_choices() -> dict[str, tuple[str, ...]]:
    return {"model": tuple(MODEL_NAMES), "data": DATASETS.names(), "strategy": NAMES,
            "rule": RULES.names(), "schedule": SCHEDULES.names(),
            "compress": tuple(CODECS.help(n) or n for n in CODECS),
            "consistency": tuple(MODELS)}


def flag_help(f: dataclasses.Field) -> str:
    """A flag's sentence, its choices and its default, from the field's declaration."""
    text = f.metadata.get("help", "")
    choices = f.metadata.get("choices") or _registry_choices().get(f.name, ())
    if choices:
        text += f"; one of {', '.join(c for c in choices if c)}"
    owners = option_owners().get(f.name)
    if owners:  # the strategies whose specs read it: with any other it is refused
        text += f" [--strategy {', '.join(owners)}]"
    default = f.default if f.default is not dataclasses.MISSING else None
    if isinstance(default, bool):
        text += f" (default: {'on' if default else 'off'})"
    elif default not in ("", None):
        text += f" (default {default})"
    return text.replace("%", "%%")  # argparse formats help with %


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (no usage block)
        sys.stderr.write(f"phalanx: error: {one_line(message)} (see {self.prog} --help)\n")
        raise SystemExit(2)


def add_run_config_flags(p: argparse.ArgumentParser, *, skip: tuple[str, ...] = ()) -> None:
    """One flag per :class:`RunConfig` field (but those in ``skip``: a sub-command shows
    only the flags it reads), grouped by the field's section; defaults stay None so a
    --config file can supply values and only flags given on the command line override it."""
    p.usage = p.usage or f"{p.prog} [--config FILE] [--SETTING VALUE ...]"
    p.add_argument("--config", metavar="FILE",
                   help="JSON or YAML file of settings (flags override it)")
    groups = {name: p.add_argument_group(f"{name} settings: {what}")
              for name, what in SECTIONS.items()}
    for f in dataclasses.fields(RunConfig):
        if f.name in skip:
            continue
        group = groups[f.metadata["section"]]
        flag = "--" + f.name.replace("_", "-")
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        help_text = flag_help(f)
        if kind == "bool":
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                               default=None, help=help_text)
        elif f.name == "slow_workers":
            group.add_argument(flag, dest=f.name, default=None, metavar="RANK:FACTOR,...",
                               help=help_text)
        else:
            conv = {"int": int, "float": float, "float | None": float}.get(kind, str)
            metavar = {"int": "N", "float": "X", "float | None": "X"}.get(kind, "TEXT")
            group.add_argument(flag, dest=f.name, type=conv, default=None, help=help_text,
                               metavar=metavar)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run configuration the flags and ``--config`` file give, checked (defaults such
    as the learning rate resolved for its strategy)."""
    return check_config(given_config(args))  # each setting, then against the strategy's spec


def given_config(args: argparse.Namespace) -> RunConfig:
    """The run configuration as the user wrote it, unchecked: ``lr`` None means they chose
    none (``phalanx compare`` then lets each strategy choose its own)."""
    given = getattr(args, "config", None)
    values = load_config_file(given) if given is not None else {}  # "" is a path: refused
    source = f"--config {given}" if given is not None else "flags"
    cfg = RunConfig.from_mapping(values, source=source)
    for f in dataclasses.fields(RunConfig):
        value = getattr(args, f.name, None)
        if value is None:
            continue
        if f.name == "slow_workers":
            value = parse_slow_workers(value)
        setattr(cfg, f.name, value)
    return cfg


# Caps a smoke run puts on every run a command starts, without editing the command: the
# docs-as-written test runs README.md's commands with e.g. "max_steps=3,train_limit=512".
# Read in one place, phalanx.entry.api.train (every run passes through it), nowhere deeper.
LIMITS_VAR = "PHALANX_LIMITS"
LIMITABLE = ("max_steps", "train_limit", "test_limit", "epochs")


def apply_limits(cfg: RunConfig, text: str) -> RunConfig:
    """``cfg`` with each named setting capped (0, "no limit", counts as above any cap)."""
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, _, value = item.partition("=")
        if name not in LIMITABLE:
            raise ConfigError(f"{LIMITS_VAR}: {name!r} is not one of {', '.join(LIMITABLE)}")
        try:
            cap = float(value) if name == "epochs" else int(value)
        except ValueError:
            raise ConfigError(f"{LIMITS_VAR}: {item!r} is not NAME=NUMBER") from None
        if cap <= 0:
            raise ConfigError(f"{LIMITS_VAR}: {item!r} must be > 0")
        current = getattr(cfg, name)
        setattr(cfg, name, cap if current == 0 else min(current, cap))
    return cfg


def one_line(message: str, limit: int = 2000) -> str:
    """An error message as one bounded line (a file name may hold a newline, a value may be
    a megabyte long)."""
    message = message.replace("\r", "\\r").replace("\n", "\\n")
    return message if len(message) <= limit else message[:limit] + "..."
