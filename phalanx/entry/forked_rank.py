"""A rank of ``phalanx schedule``'s local engine, forked from the scheduler's fork server
(:func:`phalanx.runtime.command_fork.fork_server_from_here`): the same rank as
``python -m phalanx.entry.scheduled FLAGS`` started as a fresh interpreter, without that
interpreter's ``import torch`` and strategies (~1.5 s of CPU and of start-up per rank, at
every start and every resume of a job).

What ``subprocess.Popen`` and the fresh interpreter gave the rank, :func:`main` gives it
first thing, in this order:

* SIGTERM blocked, then its default action back (the fork server ignores it). The
  launcher waits until the rank leads its own session before it returns, so every stop it
  sends finds SIGTERM blocked: the stop stays pending until
  :func:`phalanx.entry.scheduled.prepare` has armed the stop flag, as a blocked SIGTERM
  inherited through ``exec`` does for a fresh interpreter;
* its own session (``start_new_session``: a stop signals the rank's process group);
* stdout and stderr appended to the job's log, as file descriptors and as Python's
  streams; stdin ``/dev/null`` (multiprocessing);
* the launcher's environment with the rank's own, its working folder, ``sys.argv``;
* torch's intra-op threads from ``OMP_NUM_THREADS`` (a fresh interpreter reads the
  variable at ``import torch``; here torch was imported before the variable was set);
* no hold on the scheduler's fork server: multiprocessing hands every process it forks
  the write end of the server's "alive" pipe (so that its children may fork from the
  server too), and the server ends when no process holds it. Held by a rank, the server
  outlived a ``kill -9`` of the scheduler as long as the rank ran, and so did the rank,
  which dies with the server (measured: a killed scheduler's job trained on to its end).

Then the scheduled entry's own steps (:func:`phalanx.entry.scheduled.prepare`: the rank
record, death with its launcher, which is now the fork server, itself ended with the
scheduler) and the torchrun entry.
"""

from __future__ import annotations

import os
import signal
import sys
from multiprocessing import forkserver

import torch

from phalanx.entry import scheduled, torchrun
from phalanx.runtime import supervise


def main(argv: tuple[str, ...], env: dict[str, str], cwd: str, log: str) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.setsid()
    supervise.mark("forked")
    server = forkserver._forkserver
    if isinstance(getattr(server, "_forkserver_alive_fd", None), int):
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # streams of its own on those descriptors: the server's copies are whatever the
    # scheduler's were when it forked (a caller's, a test's capture: an in-memory one
    # took a rank's one-line error with it)
    sys.stdout = open(1, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    sys.argv = [scheduled.__file__, *argv]
    scheduled.prepare(os.environ)
    sys.exit(torchrun.main(list(argv)))
