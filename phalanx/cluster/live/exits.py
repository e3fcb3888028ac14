"""What a gang's exit means, as a pure function of what the loop saw (:func:`classify`),
and the one line that says why a start failed (:func:`failure_line`). The live loop
applies the outcome (``LiveCluster._ended``); kept apart so that every case is a value a
test can check without processes."""

from __future__ import annotations

import contextlib
import enum
import signal
from dataclasses import dataclass
from pathlib import Path


class Outcome(enum.Enum):
    LOST = "lost"              # a server of its placement was lost: waits to resume
    PREEMPTED = "preempted"    # stopped on request: waits to resume from its checkpoint
    RESTART = "restart"        # failed, restarts left: starts again
    TIMEOUT = "timeout"        # ran past --job-timeout: done
    FAILED = "failed"          # failed, no restart left: done
    DONE = "done"              # finished


@dataclass(frozen=True)
class Exit:
    """What the loop knows when a gang ended."""

    stop: str                  # why the loop stopped it ('' it did not; 'preempt',
                               # 'timeout', 'lost')
    rc: int                    # the gang's exit (``engines.base.gang_exit``)
    on_lost_server: bool       # its placement touches a server lost now
    summary_written: bool      # its run folder holds ``summary.json``: training ended


def classify(e: Exit, restarts: int, max_restarts: int) -> Outcome:
    """The outcome of an exit (``restarts``: those the job had, of ``max_restarts``)."""
    lost = e.stop == "lost" or (e.rc != 0 and e.stop != "timeout" and e.on_lost_server)
    # stopped just as it finished (a driver's exit code is SIGTERM's when the signal came
    # after its summary was written): done, nothing is left to resume
    finished = (e.stop == "preempt" or lost) and e.summary_written
    if lost and not finished:
        return Outcome.LOST
    if e.stop == "preempt" and e.rc != 0 and not finished:
        return Outcome.PREEMPTED
    if e.stop == "timeout":
        return Outcome.TIMEOUT
    if e.rc != 0 and not finished:
        return Outcome.RESTART if restarts < max_restarts else Outcome.FAILED
    return Outcome.DONE


def lost_line(job: str, servers: list[str]) -> str:
    """The line for a job whose start ended (a rank killed, a peer gone) as its server was
    lost, before the loop followed the loss: the loss's own line (``server S lost``) names
    only the jobs it stops, so this one would otherwise go back to the queue unnamed."""
    return (f"phalanx: scheduler: {job} stopped: server(s) {', '.join(servers) or '?'} lost; "
            "it will resume from a checkpoint")


def failure_line(path: Path, offset: int, rank: int, code: int) -> str:
    """One line for a failed start: the rank that failed first, its exit, and why. A gang's
    ranks share one log (read from ``offset``: earlier starts wrote what is before it), and
    the first failure writes first; the others only fail because of it. So the cause is the
    signal that killed that rank, else the first ``phalanx:`` line of this start (an error
    or an injected fault), else the last line that mentions an error. Never a traceback."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        text = ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    cause = ""
    if code < 0:
        with contextlib.suppress(ValueError):
            cause = f"killed by {signal.Signals(-code).name}"
    if not cause:
        cause = next((ln for ln in lines if ln.startswith("phalanx: ")), "")
    if not cause:
        cause = next((ln for ln in reversed(lines) if "error" in ln.lower()),
                     lines[-1] if lines else "no output")
    return f"rank {rank} exit {code}: {cause[:300]}"
