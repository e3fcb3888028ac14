"""The ``phalanx`` command builds only the chosen sub-command's flags (issue 48): ``phalanx
--help`` and the scheduler's and dashboard's ``--help`` import no torch, and what the other
commands show of themselves (the help line in ``phalanx --help``) is the line their own
modules declare."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from phalanx import cli
from phalanx.entry import flags


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_every_listed_help_line_is_the_one_its_module_gives():
    full = _subcommands(cli.build_parser())
    given = {a.dest: a.help for a in full._choices_actions}
    listed = {name: text for _, names in cli.COMMANDS for name, text in names}
    assert listed == given
    assert list(listed) == list(full.choices)  # the order of `phalanx --help` too


@pytest.mark.parametrize("command", ["simulate", "dashboard", "hosts", "", "nonsense"])
def test_a_chosen_command_lists_the_others_as_the_full_parser_does(command):
    assert cli.build_parser(command).format_help() == cli.build_parser().format_help()


def test_only_the_chosen_group_gets_its_flags():
    sub = _subcommands(cli.build_parser("simulate"))
    assert "--trace" in sub.choices["simulate"].format_help()
    assert "--jobs" in sub.choices["schedule"].format_help()  # the same module registers it
    assert "--strategy" not in sub.choices["train"].format_help()


def test_chosen_command_is_the_first_word_that_is_not_an_option():
    assert cli.chosen_command(["simulate", "--help"]) == "simulate"
    assert cli.chosen_command(["--version"]) == ""
    assert cli.chosen_command(["-h", "schedule", "--jobs", "x"]) == "schedule"


@pytest.mark.parametrize("message", ["plain", "a\nb\rc", "x" * 5000])
def test_one_line_is_entry_flags_one_line(message):
    assert cli.one_line(message) == flags.one_line(message)


CHECK = ("import runpy, sys; sys.argv = ['phalanx', *sys.argv[1:]]\n"
         "try:\n    runpy.run_module('phalanx.cli', run_name='__main__')\n"
         "except SystemExit as e:\n    code = e.code\n"
         "sys.stderr.write(f'{code} {\"torch\" in sys.modules}\\n')")


@pytest.mark.parametrize("argv", [["--help"], ["simulate", "--help"], ["schedule", "--help"],
                                  ["dashboard", "--help"], ["scale", "--help"],
                                  ["simulate", "--policy", "x"]])
def test_help_and_a_scheduler_error_import_no_torch(argv):
    r = subprocess.run([sys.executable, "-c", CHECK, *argv], capture_output=True, text=True,
                       timeout=120)
    assert r.stderr.splitlines()[-1] in ("0 False", "2 False"), r.stderr[-2000:]


def test_python_dash_m_phalanx_is_the_command():
    """``python -m phalanx`` runs the same command as ``phalanx`` (there was no
    ``phalanx/__main__.py``: "No module named phalanx.__main__"), exit codes included."""
    ok = subprocess.run([sys.executable, "-m", "phalanx", "--version"], capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout.startswith("phalanx "), ok.stdout + ok.stderr
    bad = subprocess.run([sys.executable, "-m", "phalanx", "simulate", "--seed", "-1"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert bad.stderr.startswith("phalanx: error: --seed"), bad.stderr
