"""How a process of a run ended, in words, and the one record of the workers a run lost.

A run can learn of a lost worker twice: the driver sees the process end (its exit code or
the signal that killed it, at once), and a server (or Sandblaster's coordinator) drops the
worker when it falls silent for ``--ps-timeout`` (at the worker's clock then). Either can
happen without the other:

* only the driver: the worker died after its last message was served (it had sent DONE),
  or the other workers finished before the server's timeout ran out;
* only a server: the worker was alive but silent (stopped, hung, cut off) and the driver
  saw no death, or no driver watched (``torchrun``);
* both: the usual crash in mid-run.

:func:`merge_losses` makes one list of them, one entry per worker, each saying who saw it
(``detected_by``) with what each one knows; ``summary.json`` holds it as ``worker_losses``
beside ``workers_lost`` (the workers' numbers), so the two never disagree.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from phalanx.runtime.stop_flag import PREEMPTED_EXIT

# A rank that found the driver's script calling phalanx.train again as multiprocessing ran
# it in the rank (no ``if __name__ == "__main__":`` around the call): it exits with this
# (EX_CONFIG) before doing anything, and the driver says what to change
REIMPORTED_MAIN_EXIT = 78

# how a process the run went on without ended (Death.how)
DIED = "died"  # after its process group formed
STOOD_IN = "died before its process group formed (a stand-in took its place)"
STOPPED = "still running after the run finished without it: stopped by the driver"


def signal_name(code: int) -> str | None:
    """The signal that killed a process with exit code ``code`` (negative), else None."""
    if code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def describe_exit(code: int) -> str:
    if code == PREEMPTED_EXIT:
        return "was stopped (SIGTERM) and wrote its state"
    if code == REIMPORTED_MAIN_EXIT:
        return ("exited at once: it runs your script again on starting (Python's "
                "multiprocessing does, to find the script's functions), and the script called "
                "phalanx.train again; put that call under `if __name__ == \"__main__\":`")
    if code < 0:
        return f"was killed by {signal_name(code)}"
    return f"exited with code {code}"


@dataclass(frozen=True, kw_only=True)
class Death:
    """A process the run went on without, as the driver saw it end."""

    rank: int  # the process's rank in the run
    name: str  # its role and number, e.g. "worker 1"
    exit_code: int  # negative: killed by that signal
    unix: float  # when the driver saw it end (wall clock)
    how: str  # DIED, STOOD_IN or STOPPED

    def event(self) -> dict[str, Any]:
        """The fields of the driver's ``died`` event."""
        return {"process": self.name, "process_rank": self.rank, "exit_code": self.exit_code,
                "signal": signal_name(self.exit_code), "how": self.how,
                "died_unix": self.unix}


def merge_losses(seen: Mapping[int, int | None], driver: Mapping[int, Death], *,
                 seer: str = "server") -> list[dict[str, Any]]:
    """One entry per lost worker, by worker number: ``seen`` maps a worker the servers
    dropped to its clock then (None: not known), ``driver`` a worker whose process the
    driver saw end to that :class:`Death`. ``detected_by`` lists who saw it, the driver
    first; the fields of whoever did not see it are None."""
    merged = []
    for w in sorted(set(seen) | set(driver)):
        d = driver.get(w)
        merged.append({
            "worker": w,
            "detected_by": [who for who, saw in (("driver", d is not None), (seer, w in seen))
                            if saw],
            "exit_code": None if d is None else d.exit_code,
            "signal": None if d is None else signal_name(d.exit_code),
            "how": None if d is None else d.how,
            "died_unix": None if d is None else d.unix,
            f"{seer}_clock": seen.get(w),
        })
    return merged


def seen_by(losses: list[dict[str, Any]], seer: str = "server") -> dict[int, int | None]:
    """The ``seen`` mapping of :func:`merge_losses` back from its entries (what a result file
    carries from the servers to the driver)."""
    return {e["worker"]: e.get(f"{seer}_clock") for e in losses if seer in e["detected_by"]}
