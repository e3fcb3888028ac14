"""The ``phalanx`` command: train, models, demo, simulate, compare, experiments.

Every user error (bad flag, bad value, bad file) prints one line
``phalanx: error: ...`` and exits 2; nothing prints a traceback for it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from phalanx.config import RunConfig, load_config_file, parse_slow_workers
from phalanx.errors import ConfigError, PhalanxError
from phalanx.limits import short
from phalanx.paths import check_out, resume_hint

# modules that add sub-commands: each has register(subparsers)
COMMAND_MODULES = ("phalanx.cluster.cli", "phalanx.experiments.cli")

_HELP = {
    "model": "model name (mlp, lenet5, resnet, logreg)",
    "data": "data set (fashion-mnist, mnist, idx, cifar10, digits, synthetic)",
    "data_dir": "directory with IDX or CIFAR-10 binary files",
    "strategy": "training strategy (single, sync, average, bsp, asp, ssp, softsync, downpour, "
                "dc-asgd, hogwild, model-parallel, pipeline, hybrid, sandblaster)",
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
    values = load_config_file(args.config) if getattr(args, "config", None) else {}
    source = f"--config {args.config}" if values else "flags"
    cfg = RunConfig.from_mapping(values, source=source)
    for f in dataclasses.fields(RunConfig):
        value = getattr(args, f.name, None)
        if value is None:
            continue
        if f.name == "slow_workers":
            value = parse_slow_workers(value)
        setattr(cfg, f.name, value)
    return cfg.validate()


def _cmd_train(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)  # flags and files first: a bad one costs no torch import
    if not cfg.resume:
        from phalanx.preflight import check_flags_apply

        check_flags_apply(cfg)  # a flag the strategy would drop silently is an error
        check_out(cfg.out)
    args.interrupt_hint = resume_hint(cfg)
    from phalanx.api import train

    result = train(config=cfg)
    s = result.summary
    print(f"test_accuracy {s['test_accuracy']:.4f}  test_loss {s['test_loss']:.4f}  "
          f"samples/s {s['samples_per_s']:.0f}  wall {s['wall_s']:.1f}s  -> {result.out}")
    return 0


def parse_input_shape(text: str, classes: int) -> tuple[int, ...]:
    """``--input-shape CxHxW`` (each 1..4096, C <= 64) and ``--classes`` (2..100000)."""
    try:
        shape = tuple(int(v) for v in text.split("x"))
    except ValueError:
        shape = ()
    if len(shape) != 3 or not (1 <= shape[0] <= 64 and all(1 <= v <= 4096 for v in shape[1:])
                               and shape[0] * shape[1] * shape[2] <= 1 << 20):
        raise ConfigError(f"--input-shape: {short(text)} is not CxHxW with C in 1..64, "
                          "H, W in 1..4096 and at most 2^20 values")
    if not 2 <= classes <= 100_000:
        raise ConfigError(f"--classes: {classes} is not in 2..100000")
    return shape


def _cmd_models(args: argparse.Namespace) -> int:
    from phalanx.models import MODELS, build_model, count_parameters

    shape = parse_input_shape(args.input_shape, args.classes)
    print(f"{'model':10s} {'parameters':>12s}   (input {args.input_shape}, {args.classes} classes)")
    for name in MODELS:
        try:
            print(f"{name:10s} {count_parameters(build_model(name, shape, args.classes)):12,d}")
        except PhalanxError as e:  # this model cannot take that input; the others can
            print(f"{name:10s} {'-':>12s}   ({e})")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from phalanx.experiments.demo import STRATEGIES, run_demo
    from phalanx.paths import check_out

    RunConfig(epochs=args.epochs, workers=args.workers, data=args.data).validate()
    check_out(args.out)

    print(f"phalanx demo: {', '.join(STRATEGIES)} on Fashion-MNIST (LeNet-5, "
          f"{args.epochs:g} epoch(s), {args.workers} workers) -> {args.out}", flush=True)
    text, report = run_demo(Path(args.out), epochs=args.epochs, workers=args.workers,
                            data=args.data)
    print(text)
    print(f"\nreport: {report}  (plots beside it; tensorboard --logdir {args.out})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="phalanx", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("train", help="train one model with one strategy")
    add_run_config_flags(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("models", help="list models with their parameter counts")
    p.add_argument("--input-shape", default="1x28x28", help="CxHxW (default 1x28x28)")
    p.add_argument("--classes", type=int, default=10)
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("demo", help="the flagship demo: four strategies compared")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--data", default="fashion-mnist")
    p.add_argument("--out", default="runs/demo")
    p.set_defaults(func=_cmd_demo)

    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue  # that part of phalanx is not in this build
            raise
        module.register(sub)
    return parser


def one_line(message: str, limit: int = 2000) -> str:
    """An error message as one bounded line (a file name may hold a newline, a value may be
    a megabyte long)."""
    message = message.replace("\r", "\\r").replace("\n", "\\n")
    return message if len(message) <= limit else message[:limit] + "..."


def main(argv: Sequence[str] | None = None) -> int:
    from phalanx.runtime.signals import install_driver_handlers, restore, signal_of

    parser = build_parser()
    args = parser.parse_args(argv)
    previous = install_driver_handlers()  # SIGTERM unwinds like Ctrl-C: children stopped
    try:
        return int(args.func(args) or 0)
    except PhalanxError as e:
        sys.stderr.write(f"phalanx: error: {one_line(str(e))}\n")
        return 2
    except KeyboardInterrupt as e:
        signum = signal_of(e)
        hint = getattr(args, "interrupt_hint", "")
        sys.stderr.write(f"phalanx: interrupted by {signal.Signals(signum).name}: every "
                         f"process of the run stopped{hint}\n")
        return 128 + signum
    finally:
        restore(previous)


if __name__ == "__main__":
    sys.exit(main())
