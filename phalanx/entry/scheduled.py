"""``python -m phalanx.entry.scheduled FLAGS``: one rank started by ``phalanx schedule``;
the ``torchrun`` entry (same flags, same environment) after two things done first thing,
before torch is imported:

* the rank records where it runs (:mod:`phalanx.runtime.rank_record`): the node its
  launcher was placed on (``PHALANX_NODE``) and its devices (``CUDA_VISIBLE_DEVICES``),
  appended to ``PHALANX_RANK_RECORD``;
* it dies with its launcher (``PR_SET_PDEATHSIG``);
* it arms its claim to be the gang's first failure (:mod:`phalanx.runtime.first_failure`);
* a preemptible rank (``PHALANX_PREEMPTIBLE=1``) arms its stop flag
  (:mod:`phalanx.runtime.stop_flag`): a SIGTERM, even one during start-up, makes every rank
  checkpoint at the first step they agree on and exit with ``PREEMPTED_EXIT``.

The environment is read here, at the entry point, and nowhere below.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Mapping

from phalanx.runtime import first_failure, rank_record, signals, stop_flag
from phalanx.runtime.signals import PR_SET_PDEATHSIG


def _die_with_parent() -> None:
    """The kernel kills this rank when its launcher (the scheduler, or the Ray actor of
    its device) dies, however it dies: no rank outlives the one that must stop it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:   # the launcher died before prctl took effect
        os._exit(1)


def prepare(env: Mapping[str, str]) -> None:
    cpus = env.get("PHALANX_CPUS", "")
    if cpus:   # the local engine's --pin-cores: this rank's cores, before any thread
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    _die_with_parent()
    signals.enable_stack_dumps()  # kill -USR2: every thread's stack on the job's log
    path = env.get("PHALANX_RANK_RECORD", "")
    if path:
        rank_record.append(path, rank_record.of_this_process(
            int(env.get("PHALANX_START", "0")), int(env.get("RANK", "0")),
            int(env.get("WORLD_SIZE", "1")), env.get("PHALANX_NODE", ""),
            env.get("CUDA_VISIBLE_DEVICES", "")))
    # the first rank of the gang to fail says so before it exits (an error, a fault)
    first_failure.arm(env.get("PHALANX_FIRST_FAILURE", ""), int(env.get("RANK", "0")))
    if env.get("PHALANX_PREEMPTIBLE") == "1":
        stop_flag.arm()
    # the launcher started us with SIGTERM blocked: a stop that came during start-up is
    # delivered now, to the flag (or, for a job that cannot be preempted, as a kill)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


if __name__ == "__main__":
    prepare(os.environ)   # before the imports below take their seconds
    from phalanx.entry import torchrun  # noqa: E402 - after arming, on purpose

    sys.exit(torchrun.main())
