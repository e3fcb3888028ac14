"""The run-configuration flags: one flag per :class:`~phalanx.config.RunConfig` field,
shared by ``phalanx train``, ``phalanx compare``, the experiments and the ``torchrun`` entry.

Every user error (bad flag, bad value, bad file) is one line ``phalanx: error: ...`` and
exit 2; nothing prints a traceback for it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from phalanx.config import RunConfig, load_config_file, parse_slow_workers
from phalanx.parallel.registry import NAMES, check_config
from phalanx.ps.consistency import MODELS

_HELP = {
    "model": "model name (mlp, lenet5, resnet, logreg)",
    "data": "data set (fashion-mnist, mnist, idx, cifar10, digits, synthetic)",
    "data_dir": "directory with IDX or CIFAR-10 binary files",
    "strategy": f"training strategy ({', '.join(NAMES)}; see docs/architecture.md)",
    "consistency": f"parameter server: the consistency model ({', '.join(MODELS)}; default: "
                   "the strategy's)",
    "slow_workers": "slow chosen workers by a factor, e.g. 0:3.0,2:1.5",
    "out": "output directory (config.json, events.jsonl, summary.json)",
    "portions": "sandblaster: portions each batch is cut into (0 = 8 x workers)",
    "history": "sandblaster: L-BFGS history size m",
    "line_search": "sandblaster: backtracking (Armijo) or none (fixed step --lr)",
    "static_portions": "sandblaster: one fixed portion per worker, no backup tasks",
    "compress": "gradient/delta compression: none, fp16, bf16, int8, topk:RATIO, randk:RATIO, "
                "powersgd:RANK[,start=N][,warm] (sync, average, parameter server)",
    "error_feedback": "keep what compression dropped and add it to the next message",
    "outer_rule": "DiLoCo outer optimizer for --strategy average: sgd or nesterov",
    "outer_lr": "outer learning rate on the pseudo-gradient (sgd 1 = plain averaging)",
    "outer_momentum": "outer Nesterov momentum",
    "downpour_local_steps": "downpour: between fetches apply each gradient to the local "
                            "weights (plain SGD at --lr, as Dean et al.'s client); "
                            "--no-downpour-local-steps computes them on the fetched weights",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (no usage block)
        sys.stderr.write(f"phalanx: error: {one_line(message)} (see {self.prog} --help)\n")
        raise SystemExit(2)


def add_run_config_flags(p: argparse.ArgumentParser) -> None:
    """One flag per :class:`RunConfig` field; defaults stay None so a --config file can
    supply values and only flags given on the command line override it."""
    p.add_argument("--config", help="JSON or YAML file of settings (flags override it)")
    for f in dataclasses.fields(RunConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = _HELP.get(f.name, "") + (f" (default {default})" if default not in ("", None)
                                             and f.name not in ("slow_workers",) else "")
        if kind == "bool":
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                           help=help_text)
        elif f.name == "slow_workers":
            p.add_argument(flag, dest=f.name, default=None, help=_HELP["slow_workers"])
        else:
            conv = {"int": int, "float": float, "float | None": float}.get(kind, str)
            p.add_argument(flag, dest=f.name, type=conv, default=None, help=help_text)


def config_from_args(args: argparse.Namespace) -> RunConfig:
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
    return check_config(cfg)  # each setting, then against the strategy's spec


def one_line(message: str, limit: int = 2000) -> str:
    """An error message as one bounded line (a file name may hold a newline, a value may be
    a megabyte long)."""
    message = message.replace("\r", "\\r").replace("\n", "\\n")
    return message if len(message) <= limit else message[:limit] + "..."
