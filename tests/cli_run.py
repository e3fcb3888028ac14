"""``phalanx``'s entry point run in the test's own process (a subprocess per case costs
~3 s of import): the exit code, argparse's included, and what it printed."""

from phalanx.cli import main


def run_main(capsys, *args):
    try:
        code = main(list(args))
    except SystemExit as e:  # argparse errors exit from inside parse_args
        code = e.code
    return code, capsys.readouterr()
