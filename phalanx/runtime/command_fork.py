"""The ``phalanx`` command's fork server, forked from the command itself.

Every rank of a local run is forked from a fork server (:mod:`phalanx.runtime.supervise`).
Started as multiprocessing starts it, that server is a fresh interpreter that imports torch
and every strategy again, 1.5-2 s of CPU and of start-up after the command has imported
them already. The command forks it from itself instead, once its flags are checked and
before it reads data or computes (docs/architecture.md, "Starting processes").
"""

from __future__ import annotations

import ctypes
import importlib
import os
import signal
import sys
import threading
import warnings

from phalanx.runtime import supervise

# False only for bench/startup.py's comparison with the fresh-interpreter server
FORK_FROM_COMMAND = True
FORK_SERVER_NAME = "phalanx-fork"  # /proc/PID/comm of a fork server forked from the driver
PR_SET_NAME = 15


def fork_server_from_here() -> bool:
    """Start the fork server as a fork of this process, not a fresh interpreter that
    imports :data:`~phalanx.runtime.supervise.PRELOAD` again (~1.5-2 s of CPU and as much
    start-up latency per run). For the ``phalanx`` command only, before it reads data or
    computes: the process must have started no thread of its own (``import torch`` leaves
    it with the one the server has too), opened no GPU and taken no lock, the state a forked
    rank may start from. The server is then the one ``supervise.process_context`` gives:
    its stdlib protocol, its socket, its "alive" pipe (it ends when this process does),
    signal dispositions as a fresh interpreter's (SIGTERM ignored, as
    ``runtime/preloaded.py`` has it). False (nothing started; the first rank then starts
    the fresh server) where the start method is not the fork server, a server runs already,
    or this process has a Python thread or has initialised CUDA."""
    from multiprocessing import forkserver, resource_tracker, util

    if (supervise.START_METHOD != "forkserver" or not FORK_FROM_COMMAND
            or not hasattr(util, "spawnv_passfds")):
        return False
    torch = sys.modules.get("torch")
    if threading.active_count() > 1 or (torch is not None and torch.cuda.is_initialized()):
        return False  # not a state to fork from: the server starts as a fresh interpreter
    supervise.process_context()
    server = forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is not None:
        return False
    for name in supervise.PRELOAD:  # here, once, what the server would import
        importlib.import_module(name)
    resource_tracker.ensure_running()  # a fresh interpreter of its own, as always
    real = util.spawnv_passfds
    util.spawnv_passfds = _fork_passfds
    try:
        server.ensure_running()
    finally:
        util.spawnv_passfds = real
    return True


def _fork_passfds(path: str, args: list[str], passfds: list[int]) -> int:
    """``util.spawnv_passfds`` for :func:`fork_server_from_here`: fork, and run in the
    child the ``-c`` code the stdlib built for the new interpreter."""
    code = args[args.index("-c") + 1]
    pipes = {link for fd in passfds
             if (link := os.readlink(f"/proc/self/fd/{fd}")).startswith("pipe:")}
    with warnings.catch_warnings():  # Python 3.12: a process with threads; see above
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid:
        return pid
    status = 1
    try:
        # the write end of the "alive" pipe (and any other end of a passed pipe) is the
        # parent's alone: held here, the server would outlive it
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd not in passfds:
                try:
                    if os.readlink(f"/proc/self/fd/{fd}") in pipes:
                        os.close(fd)
                except OSError:
                    pass
        try:  # its name in ps / top (its command line is the driver's)
            ctypes.CDLL(None).prctl(PR_SET_NAME, FORK_SERVER_NAME.encode(), 0, 0, 0)
        except (OSError, AttributeError):
            pass
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # as runtime/preloaded.py has the fresh server do (whether or not this process
        # imported that module already): a SIGTERM to the run's process group must leave
        # the server up while its ranks write their checkpoints
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        exec(code, {"__name__": "__phalanx_fork_server__"})  # noqa: S102 - the stdlib's own
        status = 0
    except SystemExit as e:  # the server's way out: the driver's pipe closed
        status = e.code if isinstance(e.code, int) else 0
    except BaseException:  # noqa: BLE001 - said on stderr, and the server is gone
        import traceback

        traceback.print_exc()
    finally:
        os._exit(status)  # never the driver's atexit handlers, never back into its code
