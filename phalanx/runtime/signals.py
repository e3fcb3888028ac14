"""Signals: the driver stops a run cleanly on SIGTERM / SIGINT; children never outlive it.

* Driver (the ``phalanx`` process): SIGTERM raises :class:`Terminated` (a
  ``KeyboardInterrupt``, like SIGINT) in the main thread, so both unwind the same way: the
  launcher stops every child, temp folders are removed, the CLI prints one line and exits
  128 + the signal number.
* Children: they ignore SIGINT (a Ctrl-C reaches the whole process group; the driver
  decides and stops them, so no child prints a ``KeyboardInterrupt`` traceback), and the
  kernel kills them when the driver dies, even by ``kill -9`` (``PR_SET_PDEATHSIG``; a
  polling thread where prctl is missing).
* Temp folders of a driver killed by ``kill -9`` are removed by the next run
  (:func:`sweep_stale_dirs`): their names carry the pid that made them.
* ``kill -USR2 PID`` of a driver or a rank prints every thread's Python stack on its
  stderr, and the process goes on (:func:`enable_stack_dumps`): what a run that hangs is
  doing, without a debugger.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

from phalanx.errors import ConfigError

PR_SET_PDEATHSIG = 1


class Terminated(KeyboardInterrupt):
    """SIGTERM (or another stop signal) arrived; unwinds like Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signal_of(e: BaseException) -> int:
    """The signal behind an interrupt: SIGTERM for :class:`Terminated`, else SIGINT."""
    return getattr(e, "signum", signal.SIGINT)


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(signum)


STACK_DUMP_SIGNAL = signal.SIGUSR2


def enable_stack_dumps() -> None:
    """``STACK_DUMP_SIGNAL`` prints every thread's Python stack on stderr (as it is now:
    call again after moving stderr), from C, so a thread blocked in a C++ wait is shown
    too; the process goes on. Registered anew each time: a fork inherits faulthandler's
    note that the signal is taken even where its handler was reset since (a fork server
    resets it), and registering again would then install nothing."""
    try:
        faulthandler.unregister(STACK_DUMP_SIGNAL)
        faulthandler.register(STACK_DUMP_SIGNAL, all_threads=True)
    except (ValueError, OSError, RuntimeError, AttributeError):
        pass  # no usable stderr (a closed or replaced stream): nothing to print to


def install_driver_handlers() -> dict[int, object]:
    """SIGTERM and SIGHUP (the terminal went away) -> :class:`Terminated` in the main
    thread (a no-op elsewhere), and stack dumps (:func:`enable_stack_dumps`). Returns the
    previous handlers for :func:`restore`."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    enable_stack_dumps()
    return {s: signal.signal(s, _raise_terminated) for s in (signal.SIGTERM, signal.SIGHUP)}


def restore(previous: dict[int, object]) -> None:
    """Put back what :func:`install_driver_handlers` replaced (``main()`` may run inside
    another program, e.g. a test runner)."""
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _watch_parent(parent_pid: int) -> None:
    while True:
        if not pid_alive(parent_pid) or os.getppid() == 1:
            os._exit(1)
        time.sleep(0.5)


def child_setup(parent_pid: int) -> None:
    """Call first thing in a child process: die with the driver, leave SIGINT to it; stack
    dumps on its stderr (:func:`enable_stack_dumps`)."""
    enable_stack_dumps()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    armed = False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        armed = libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        pass
    # a rank forked by the fork server (runtime.supervise) is the server's child, and the
    # server ends when the driver does: the death signal then comes through it
    if not pid_alive(parent_pid) or os.getppid() == 1:  # the driver died before prctl took effect
        os._exit(1)
    if not armed or os.getppid() != parent_pid:
        threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (a zombie not yet reaped still does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


AF_UNIX_MAX = 107  # bytes in an AF_UNIX socket's path (sun_path, less its NUL)


def socket_temp_root(tail: int, what: str) -> str:
    """Where a temp folder goes whose sockets lie ``tail`` bytes below the temp root: the
    temp folder (``TMPDIR``) when their paths fit AF_UNIX's limit, else /tmp (users'
    TMPDIRs are often long); a one-line error naming TMPDIR when neither can hold them."""
    root = tempfile.gettempdir()
    for candidate in (root, "/tmp"):
        if len(os.fsencode(candidate)) + tail <= AF_UNIX_MAX and os.access(candidate, os.W_OK):
            return candidate
    raise ConfigError(f"TMPDIR {root}: too long for {what} ({AF_UNIX_MAX} bytes at most; "
                      f"give a temp folder of at most {AF_UNIX_MAX - tail} bytes) and /tmp "
                      "is not writable")


def make_run_tempdir(prefix: str, root: str | None = None) -> str:
    """A temp folder named ``PREFIX<pid>-...`` (so a later run can tell it is stale), in
    ``root`` (default: the temp folder; shared-memory rings: ``/dev/shm``)."""
    sweep_stale_dirs(prefix, root)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=root)


def sweep_stale_dirs(prefix: str, root: str | None = None) -> int:
    """Remove this user's ``PREFIX<pid>-*`` temp folders (in ``root``) whose pid is gone;
    returns how many were removed."""
    removed = 0
    for path in Path(root or tempfile.gettempdir()).glob(f"{prefix}*-*"):
        pid_s = path.name[len(prefix):].partition("-")[0]
        try:
            if not pid_s.isdigit() or path.stat().st_uid != os.getuid() or pid_alive(int(pid_s)):
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed
