"""The ``phalanx`` command: train, models, demo, simulate, schedule, compare, experiments.

Every user error (bad flag, bad value, bad file) prints one line
``phalanx: error: ...`` and exits 2; nothing prints a traceback for it.

Only the chosen sub-command's module is imported and builds its flags: the training side's
(``train``, ``compare``, ``experiments``, ``scale``) import torch, and ``phalanx --help``,
``phalanx simulate --help`` or ``phalanx dashboard --help`` should not wait for it
(bench/startup.py measures them). The others are listed by name and help line only.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Sequence

from phalanx import __version__
from phalanx.errors import ConfigError, PhalanxError
from phalanx.runtime.hosts import hosts_down, hosts_up, kept_hosts
from phalanx.runtime.signals import install_driver_handlers, restore, signal_of
from phalanx.runtime.stop_flag import PREEMPTED_EXIT

Register = Callable[[argparse._SubParsersAction], None]


def one_line(message: str, limit: int = 2000) -> str:
    """An error message as one bounded line: ``phalanx.entry.flags.one_line``, which the
    command cannot import before its sub-command is chosen (``entry.flags`` imports torch)."""
    message = message.replace("\r", "\\r").replace("\n", "\\n")
    return message if len(message) <= limit else message[:limit] + "..."


class CommandParser(argparse.ArgumentParser):
    """``phalanx.entry.flags._Parser`` for the command and its sub-commands (imported
    without torch): an error is one line and exit 2, no usage block."""

    def error(self, message: str) -> None:
        sys.stderr.write(f"phalanx: error: {one_line(message)} (see {self.prog} --help)\n")
        raise SystemExit(2)


DESCRIPTION = ("phalanx: train one model with many workers under every synchronisation "
               "protocol (real processes, CPU or CUDA, one host or several), and schedule "
               "many training jobs on a GPU cluster (simulated from real traces, or live).")


def _cmd_hosts(args: argparse.Namespace) -> int:
    if args.action == "up":
        if args.rate_mbit is not None and not 0 < args.rate_mbit < 1e6:
            raise ConfigError(f"--rate-mbit: {args.rate_mbit} is not in (0, 1e6)")
        for h in hosts_up(args.count, args.rate_mbit):
            print(f"{h.name}  {h.addr}  run in it: ip netns exec {h.name} COMMAND")
        print("remove them with: phalanx hosts down")
    elif args.action == "down":
        names = hosts_down()
        print(f"removed {len(names)} namespace(s)" + (f": {', '.join(names)}" if names else ""))
    else:
        for name in kept_hosts():
            print(name)
    return 0


def _training(sub: argparse._SubParsersAction) -> None:
    from phalanx import cli_train

    cli_train.register(sub)


def _hosts(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hosts", help=HOSTS_HELP)
    p.add_argument("action", choices=["up", "down", "list"])
    p.add_argument("count", nargs="?", type=int, default=2, help="hosts to make (up; default 2)")
    p.add_argument("--rate-mbit", type=float, default=None,
                   help="shape every host's link to this rate (tc tbf)")
    p.set_defaults(func=_cmd_hosts)


def _cluster(sub: argparse._SubParsersAction) -> None:
    from phalanx.cluster.cli import simulate

    simulate.register(sub)


def _interference(sub: argparse._SubParsersAction) -> None:
    from phalanx.cluster.cli import interference

    interference.register(sub)


def _chaos(sub: argparse._SubParsersAction) -> None:
    from phalanx.cluster.cli import chaos

    chaos.register(sub)


def _experiments(sub: argparse._SubParsersAction) -> None:
    from phalanx.experiments import cli

    cli.register(sub)


def _dashboard(sub: argparse._SubParsersAction) -> None:
    from phalanx.dashboard import cli

    cli.register(sub)


def _scale(sub: argparse._SubParsersAction) -> None:
    from phalanx.scale import cli

    cli.register(sub)


DASHBOARD_HELP = ("a read-only web page over a folder of runs and schedules (live: it follows "
                  "them as they grow)")
SCALE_HELP = ("predict step time, bytes and efficiency of every strategy at 8..4096 workers "
              "(a simulator)")
INTERFERENCE_HELP = ("measure how much of its solo rate each job class keeps beside another "
                     "on this machine (real jobs pinned to cores)")
CHAOS_HELP = ("run a live schedule of short real jobs under random, seeded faults and check "
              "its invariants")
HOSTS_HELP = ("test hosts on this machine (network namespaces on a bridge, as root) to try "
              "multi-node runs")
# every sub-command in the order ``phalanx --help`` lists them: the function that adds a
# group's parsers (importing its module), and each command's help line, which lists it
# when another command is chosen (tests/unit/test_cli_startup.py holds each line to the
# one its module gives)
COMMANDS: tuple[tuple[Register, tuple[tuple[str, str], ...]], ...] = (
    (_training, (("train", "train one model with one strategy"),
                 ("models", "list models with their parameter counts"),
                 ("demo", "the flagship demo: four strategies compared"))),
    (_hosts, (("hosts", HOSTS_HELP),)),
    (_cluster, (("simulate", "trace-driven simulation of the cluster scheduler"),
                ("schedule", "live mode: run a job list of phalanx training runs on local "
                             "slots, a Ray or a Slurm cluster with a scheduling policy"))),
    (_interference, (("interference", INTERFERENCE_HELP),)),
    (_chaos, (("chaos", CHAOS_HELP),)),
    (_experiments, (("compare", "run several strategies on the same job; write a report"),
                    ("experiments", "the literature's claims as reproducible studies"))),
    (_dashboard, (("dashboard", DASHBOARD_HELP),)),
    (_scale, (("scale", SCALE_HELP),)),
)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command's parser. ``command``: the sub-command chosen; its group's module is
    imported and builds their flags, every other command is its name and help line only.
    None: every command with its flags (the tests, the docs)."""
    parser = CommandParser(prog="phalanx", description=DESCRIPTION,
                           epilog="Run 'phalanx COMMAND --help' for a command's flags. Docs: "
                                  "README.md and docs/ in the source tree.")
    parser.add_argument("--version", action="version", version=f"phalanx {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser,
                                metavar="COMMAND")
    for register, names in COMMANDS:
        if command is None or any(name == command for name, _ in names):
            register(sub)
        else:
            for name, text in names:
                sub.add_parser(name, help=text)
    return parser


def chosen_command(argv: Sequence[str]) -> str:
    """The sub-command ``argv`` names: its first word that is not an option (the command's
    own options, --help and --version, take no value); "" when there is none."""
    return next((a for a in argv if not a.startswith("-")), "")


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(chosen_command(argv))
    args = parser.parse_args(argv)
    previous = install_driver_handlers()  # SIGTERM unwinds like Ctrl-C: children stopped
    try:
        return int(args.func(args) or 0)
    except PhalanxError as e:
        sys.stderr.write(f"phalanx: error: {one_line(str(e))}\n")
        return 2
    except KeyboardInterrupt as e:
        signum = signal_of(e)
        name = signal.Signals(signum).name
        if getattr(e, "saved", False):
            # every process that holds state wrote it when stopped (a parameter server's
            # shards): a SIGTERM is a preemption, the run continues from exactly there
            folder = getattr(args, "resume_folder", "")
            said = (f"preempted by {name}" if signum == signal.SIGTERM
                    else f"interrupted by {name}")
            sys.stderr.write(f"phalanx: {said}: every process of the run stopped; every "
                             f"shard wrote its state: continue from there with phalanx "
                             f"train --resume {folder}\n")
            return PREEMPTED_EXIT if signum == signal.SIGTERM else 128 + signum
        hint = getattr(args, "interrupt_hint", "")
        sys.stderr.write(f"phalanx: interrupted by {name}: every "
                         f"process of the run stopped{hint}\n")
        return 128 + signum
    finally:
        restore(previous)


if __name__ == "__main__":
    sys.exit(main())
