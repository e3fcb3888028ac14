"""The training side's sub-commands of ``phalanx``: train, models, demo.

Their flags and their runs import torch, every strategy and the models; ``phalanx.cli``
imports this module only when one of them is chosen (or ``build_parser()`` builds every
command), so ``phalanx --help`` and the scheduler's commands start without it. Every
module ``phalanx train`` imported here, before its fork server is forked from it, is one
each rank finds imported (runtime/command_fork.py).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from phalanx.config import RunConfig
from phalanx.entry.api import train
from phalanx.entry.flags import add_run_config_flags, config_from_args
from phalanx.entry.paths import check_out, resume_hint
from phalanx.entry.resume import saved_config
from phalanx.errors import ConfigError, PhalanxError
from phalanx.experiments.demo import STRATEGIES as DEMO_STRATEGIES
from phalanx.experiments.demo import run_demo
from phalanx.limits import short
from phalanx.models import MODELS, build_model, count_parameters
from phalanx.models.gpt import SIZES as GPT_SIZES
from phalanx.models.zoo import MODEL_TASKS
from phalanx.parallel.registry import check_flags_apply, spec
from phalanx.runtime.command_fork import fork_server_from_here
from phalanx.runtime.supervise import preload


def register(sub: argparse._SubParsersAction) -> None:
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


def _cmd_train(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)  # flags and files first: nothing is read or started yet
    if not cfg.resume:
        check_flags_apply(cfg)  # a flag the strategy would drop silently is an error
        check_out(cfg.out)
    args.interrupt_hint = resume_hint(cfg)
    args.resume_folder = cfg.resume or cfg.out
    run = cfg
    if cfg.resume:  # the run's own strategy and world; train() says what is wrong with it
        with contextlib.suppress(PhalanxError):
            run = saved_config(cfg)
    strategy = spec(run.strategy)
    if strategy.world_size(run) > 1:
        # its ranks fork from a copy of this process, torch and what the strategy's ranks
        # need imported, nothing else begun (a resumed run too: it started a fresh server,
        # ~1.5 s of CPU more per resume, each preemption of a scheduled PS job)
        preload(*strategy.preload)
        fork_server_from_here()
    result = train(config=cfg)
    s = result.summary
    rate = "-" if s["samples_per_s"] is None else f"{s['samples_per_s']:.0f}"
    startup = "" if s["startup_s"] is None else f" (start-up {s['startup_s']:.1f}s)"
    print(f"test_accuracy {s['test_accuracy']:.4f}  test_loss {s['test_loss']:.4f}  "
          f"samples/s {rate} (steady state)  wall {s['wall_s']:.1f}s{startup}  -> {result.out}")
    if "test_perplexity" in s:  # a language model: its figures and what it writes
        tokens = "-" if s.get("tokens_per_s") is None else f"{s['tokens_per_s']:.0f}"
        print(f"test_loss {s['test_loss']:.4f} nats/token  perplexity "
              f"{s['test_perplexity'] or float('inf'):.2f}  tokens/s {tokens}  sample:")
        print(s.get("sample_text", ""))
    if "test_auc" in s:  # a click model: log-loss and AUC against the data's best
        f = {k: float("nan") if s.get(k) is None else s[k]
             for k in ("data_best_logloss", "data_base_logloss", "test_auc", "data_best_auc")}
        print(f"log-loss {s['test_loss']:.4f} (best {f['data_best_logloss']:.4f}, base rate "
              f"{f['data_base_logloss']:.4f})  AUC {f['test_auc']:.4f} (best "
              f"{f['data_best_auc']:.4f})")
    if s.get("stop_reason") == "budget" and s.get("steps", 0) < FEW_LBFGS:
        # L-BFGS cut short by the budget: say so, the result is not what it can do
        print(f"note: sandblaster made {s['steps']} L-BFGS iteration(s) before the budget "
              f"ended it (one per pass over the data after the first); it needs tens to "
              f"learn: give --epochs 50 or more, or leave --epochs at 1 (its default budget, 100 "
              f"passes), or --max-steps N iterations", file=sys.stderr)
    if s.get("worse_than_start"):
        stop = f", stop reason: {s['stop_reason']}" if s.get("stop_reason") else ""
        raise PhalanxError(f"the run ended worse than it started: test loss "
                           f"{s['initial_test_loss']:.4f} -> "
                           f"{s['start_samples_test_loss']:.4f} on the first "
                           f"{s['start_samples']} test samples after "
                           f"{s['steps']} steps{stop}; a longer run or another --lr may "
                           f"train (results in {result.out})")
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
    shape = parse_input_shape(args.input_shape, args.classes)
    print(f"{'model':10s} {'parameters':>12s}   (input {args.input_shape}, {args.classes} classes)")
    for name in MODELS:
        own = OWN_INPUTS.get(MODEL_TASKS.get(name, "classify"))
        try:
            if own:  # a text or click model: at its defaults, on its own data's shape
                n = count_parameters(build_model(name, own[0], own[1], **own[2]))
                print(f"{name:10s} {n:12,d}   ({own[3]})")
                for size, flags in GPT_SIZES.items() if name == "gpt" else ():
                    if flags != {k: GPT_DEFAULTS[k] for k in flags}:  # the default's above
                        n = count_parameters(build_model(name, own[0], own[1], **flags))
                        given = " ".join(f"--gpt-{k} {v}" for k, v in flags.items())
                        print(f"{'  ' + size:10s} {n:12,d}   ({given})")
            else:
                print(f"{name:10s} {count_parameters(build_model(name, shape, args.classes)):12,d}")
        except PhalanxError as e:  # this model cannot take that input; the others can
            print(f"{name:10s} {'-':>12s}   ({e})")
    return 0


# fewer L-BFGS iterations than this, cut short by the budget, are worth a note: Sandblaster
# on LeNet-5 / Fashion-MNIST at 2 iterations stays at chance (issue 51's appendix)
FEW_LBFGS = 10
GPT_DEFAULTS = {"layers": RunConfig.gpt_layers, "dim": RunConfig.gpt_dim,
                "heads": RunConfig.gpt_heads}

# the input a model of another task is counted on: (shape, classes, options, in words)
OWN_INPUTS = {
    "lm": ((64,), 65, {}, "its defaults on Tiny Shakespeare: context 64, 65 characters"),
    "ctr": ((39,), 2, {"dense": 13},
            "its defaults on ctr-synthetic: 13 dense features, 26 fields"),
}


def _cmd_demo(args: argparse.Namespace) -> int:
    RunConfig(epochs=args.epochs, workers=args.workers, data=args.data).validate()
    check_out(args.out)

    print(f"phalanx demo: {', '.join(DEMO_STRATEGIES)} on Fashion-MNIST (LeNet-5, "
          f"{args.epochs:g} epoch(s), {args.workers} workers) -> {args.out}", flush=True)
    fork_server_from_here()  # every strategy's ranks fork from a copy of this process
    text, report = run_demo(Path(args.out), epochs=args.epochs, workers=args.workers,
                            data=args.data)
    print(text)
    print(f"\nreport: {report}  (plots beside it; tensorboard --logdir {args.out})")
    return 0
