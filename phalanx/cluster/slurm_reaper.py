"""``python -I slurm_reaper.py CMD...``: run a local cluster's ``slurmd`` (``CMD``) as a
child subreaper.

``slurmd`` starts each job's ``slurmstepd`` with a double fork, so the step is orphaned at
once; its parent becomes the nearest subreaper, else PID 1, which in a container may never
reap it: every job would leave a zombie behind. This process is that subreaper: it reaps
every orphan of its ``slurmd``, passes SIGTERM / SIGINT on to it, and exits with its code
once no descendant is left. Standard library only (it is run by path).
"""

import ctypes
import os
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36


def main(argv: list[str]) -> int:
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    pid = os.fork()
    if pid == 0:
        os.execvp(argv[0], argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: os.kill(pid, s))
    code = 1
    while True:
        try:
            child, status = os.wait()
        except ChildProcessError:   # nothing left to reap
            return code
        except InterruptedError:
            continue
        if child == pid:
            code = os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
