"""Run many ``phalanx`` command lines from one pre-loaded parent: import the CLI (torch and
every strategy) once, then fork one child per command line.

A child is a real process running ``phalanx.cli.main(argv)`` in its own folder and process
group, with its own stdout/stderr files and an environment marker (inherited by anything it
starts, so a leftover can be found). What it shares with its siblings is only the imported
code, the expensive part: a case costs milliseconds instead of a fresh interpreter's ~2 s
of ``import torch``.

Input (stdin): a JSON list of ``{"name", "argv", "cwd", "env": {K: V}, "timeout"}``.
Output (stdout, last line): JSON ``{name: {"code": int | null, "seconds": float}}``, with
``code`` null when the case ran past its timeout (its process group is then killed).
Each child writes ``cwd/.stdout`` and ``cwd/.stderr``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback

PARALLEL = 3  # children at once: a 2-core machine, and most cases wait on nothing


def _child(case: dict) -> None:
    os.setpgid(0, 0)  # its own group: a timeout kills whatever it started
    os.chdir(case["cwd"])
    for key, value in case["env"].items():
        os.environ[key] = value  # putenv: processes it starts inherit the marker
    for fd, name in ((1, ".stdout"), (2, ".stderr")):
        out = os.open(os.path.join(case["cwd"], name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, fd)
        os.close(out)
    code = 1
    try:
        from phalanx.cli import main  # already imported by the parent: a dict lookup

        code = main(case["argv"])
    except SystemExit as e:  # argparse: exit 2 after its one line
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - a traceback is what the test looks for
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run(cases: list[dict]) -> dict[str, dict]:
    pending, running, results = list(cases), {}, {}
    while pending or running:
        while pending and len(running) < PARALLEL:
            case = pending.pop(0)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(case)
            running[pid] = (case, time.monotonic())
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            case, t0 = running.pop(pid)
            results[case["name"]] = {"code": os.waitstatus_to_exitcode(status),
                                     "seconds": time.monotonic() - t0}
            continue
        now = time.monotonic()
        for pid, (case, t0) in list(running.items()):
            if now - t0 > case["timeout"]:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                os.waitpid(pid, 0)
                running.pop(pid)
                results[case["name"]] = {"code": None, "seconds": now - t0}
        time.sleep(0.005)
    return results


if __name__ == "__main__":
    import phalanx.cli
    import phalanx.cluster.cli.schedule_run  # noqa: F401 - a schedule's run (torch)

    # the one import every child shares: the command imports a sub-command's modules when
    # it is chosen; here every sub-command's are imported once
    phalanx.cli.build_parser()

    print(json.dumps(run(json.load(sys.stdin))))
