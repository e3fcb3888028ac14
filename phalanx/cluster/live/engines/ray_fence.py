"""A node cut off from its Ray cluster stops its own ranks (fencing).

A network partition leaves the cut-off node's ranks running: its peers across the cut and
the GCS hear nothing, the GCS calls the node dead once its health check has run out
(:class:`~phalanx.cluster.live.engines.ray_cluster.HealthCheck`), and the scheduler starts
the node's jobs elsewhere from their last checkpoints. Unfenced, the ranks left behind ran
on until gloo's timeout (measured: 120 s, then an error line and an event appended to the
resumed run's files, docs/cluster.md), and a rank that needs no peer (a one-device job, a
driver) would have trained and checkpointed beside its own resumed copy.

So each device's actor holds a lease on its node's life: it asks the GCS every
:data:`ASKS_PER_LEASE`-th of the lease whether its node is alive (``check_alive``, one
small call), and a rank may run only while the last "alive" answer is at most
``fence_s`` old (half the soonest verdict the GCS can reach on a silent node). The lease is
counted from when a question was *asked*: an answer proves the link held until then.
When the lease runs out, or the GCS answers that the node is dead (the link came back
after the verdict), the actor kills its rank's process group: the cut-off ranks are gone
before the scheduler can hear the node is dead, and nothing of theirs writes after the
resumed start begins. :class:`Lease` is the rule, without threads or clocks; :class:`Fence`
runs it in the actor.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

ASKS_PER_LEASE = 4      # questions to the GCS per lease (each may take a quarter of it)
KILL_S = 1.0            # a rank's process group killed and gone, on a busy machine


def fenced_after_s(fence_s: float) -> float:
    """How long after the cluster called a node dead its ranks may still run, at most: the
    last "alive" answered a question asked before the verdict, the lease is checked every
    eighth of it, and a kill takes a moment. The scheduler waits this long before it counts
    a lost node's rank as ended (and starts its job elsewhere): the lease alone cannot
    promise the ranks are gone by the verdict, because the GCS counts a node's failed
    health checks across a partition that had healed a moment (its checks of the node were
    still failing while the node's own questions got "alive"), so a second cut can be
    called dead well under ``fence_s`` after the node last heard "alive" (``phalanx chaos
    --engine ray``, seed 206: 1.2 s after the cut; the job ran on two hosts at once for
    1.5 s)."""
    return fence_s * (1 + 1 / (2 * ASKS_PER_LEASE)) + KILL_S


def dead_rank_ended(down_for_s: float | None, died_for_s: float, verdict_s: float,
                    fence_s: float) -> bool:
    """Does a rank whose actor was found dead ``died_for_s`` ago count as ended? Once its
    node has been called lost (``down_for_s`` ago; None: it is not) for
    :func:`fenced_after_s`, or, with no verdict, once the cluster's own time to reach one
    and that have passed."""
    fenced = fenced_after_s(fence_s)
    return (down_for_s is not None and down_for_s >= fenced) or died_for_s > verdict_s + fenced


@dataclass
class Lease:
    """The node may run ranks while the GCS said "alive" to a question asked at most
    ``fence_s`` ago, and never again once it said "dead"."""

    fence_s: float
    asked_at: float              # the question the last "alive" answered (or the start)
    dead: bool = False

    def answer(self, asked_at: float, alive: bool) -> None:
        if not alive:
            self.dead = True
        elif asked_at > self.asked_at:
            self.asked_at = asked_at

    def expired(self, now: float) -> bool:
        return self.dead or now - self.asked_at > self.fence_s

    def why(self, now: float) -> str:
        if self.dead:
            return "the cluster called this node dead"
        return (f"no word from the cluster for {now - self.asked_at:.1f} s "
                f"(lease {self.fence_s:g} s)")


class Fence:
    """Runs a :class:`Lease` in a device's actor: one thread asks (``ask(timeout_s)``: is
    this node alive? raises when the GCS does not answer), another checks the lease and
    calls ``cut(why)`` while it has run out (``cut`` must be idempotent: it kills the rank
    of the moment, if any). A question that hangs past its timeout holds up the next
    question, never the check."""

    def __init__(self, fence_s: float, ask: Callable[[float], bool],
                 cut: Callable[[str], None], clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.lease = Lease(fence_s, clock())
        self.ask, self.cut, self.clock = ask, cut, clock
        self.every_s = fence_s / ASKS_PER_LEASE
        self.done = threading.Event()
        self.threads = [threading.Thread(target=f, daemon=True, name=f"phalanx-fence-{n}")
                        for n, f in (("ask", self._asking), ("check", self._checking))]
        for t in self.threads:
            t.start()

    def _asking(self) -> None:
        while not self.done.is_set():
            t = self.clock()
            try:
                alive = self.ask(self.every_s)
            except Exception:   # noqa: BLE001 - no answer (timeout, GCS unreachable)
                alive = None
            if alive is not None:
                self.lease.answer(t, alive)
            self.done.wait(max(0.0, self.every_s - (self.clock() - t)))

    def _checking(self) -> None:
        while not self.done.wait(self.every_s / 2):
            now = self.clock()
            if self.lease.expired(now):
                self.cut(self.lease.why(now))

    def close(self) -> None:
        self.done.set()
