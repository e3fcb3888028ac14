"""``python -I slurm_reaper.py CMD...``: run one daemon of a local Slurm cluster (``CMD``:
``munged``, ``slurmctld`` or a ``slurmd``) as a child subreaper that dies with the scheduler.

* ``slurmd`` starts each job's ``slurmstepd`` with a double fork, so the step is orphaned at
  once; its parent becomes the nearest subreaper, else PID 1, which in a container may
  never reap it: every job would leave a zombie behind. This process is that subreaper.
* It passes SIGTERM / SIGINT on to the daemon. Once the daemon is gone after a SIGTERM, it
  SIGKILLs whatever it still holds (job steps, whose ranks die with them).
* It gets SIGTERM when the scheduler dies, however it dies (``PR_SET_PDEATHSIG``): a
  killed ``phalanx schedule`` leaves no daemon and no job running.

It exits with the daemon's code once nothing is left to reap. Standard library only (it is
run by path).
"""

import contextlib
import ctypes
import os
import signal
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def children() -> list[int]:
    """This process's children (the orphans it adopted included)."""
    me, out = os.getpid(), []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                # the command name may hold spaces: the fields after its ')' are plain
                if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == me:
                    out.append(int(proc.name))
    return out


def main(argv: list[str]) -> int:
    libc = ctypes.CDLL(None)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() == 1:   # the scheduler died before prctl took effect
        return 1
    stopping: list[int] = []
    daemon = [0]

    def forward(sig: int, _frame: object) -> None:
        stopping.append(sig)
        if daemon[0]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(daemon[0], sig)

    for sig in (signal.SIGTERM, signal.SIGINT):   # before the fork: no stop is lost
        signal.signal(sig, forward)
    pid = daemon[0] = os.fork()
    if pid == 0:
        os.execvp(argv[0], argv)   # exec resets the handlers
    if stopping:
        os.kill(pid, stopping[0])
    code, daemon_alive = 1, True
    while True:
        try:
            child, status = os.wait()
        except ChildProcessError:   # nothing left to reap
            return code
        except InterruptedError:
            continue
        if child == pid:
            code, daemon_alive = os.waitstatus_to_exitcode(status), False
        if not daemon_alive and stopping:
            for c in children():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
