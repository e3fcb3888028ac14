"""Sandblaster's load balancing: which worker computes which portion of a batch.

Dynamic (the default): a batch is cut into many more portions than there are workers and
each free worker gets the next one, so faster workers do more. When none is left but some
are still being computed, a free worker gets a copy of an outstanding one (a *backup
task*, as in MapReduce); the first answer wins, later ones are *wasted*. A portion held by
a worker found dead goes back to the queue. Static (``--static-portions``): portion i
belongs to worker i, no backups; only a dead worker's portion is handed to another.

Pure bookkeeping (no transport, no clock: the coordinator passes an issue counter), so it
is tested directly.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class PortionCounts:
    """Per evaluation (or summed over an iteration)."""

    portions_done: list[int]  # first answers, per worker
    backups_issued: int = 0
    backups_wasted: int = 0  # answers that lost the race (or came after the evaluation)
    reissued: int = 0  # portions of dead workers handed out again

    def add(self, other: PortionCounts) -> None:
        self.portions_done = [a + b for a, b in zip(self.portions_done, other.portions_done)]
        self.backups_issued += other.backups_issued
        self.backups_wasted += other.backups_wasted
        self.reissued += other.reissued


@dataclass
class PortionScheduler:
    workers: int
    portions: int
    static: bool = False
    max_copies: int = 2  # a portion runs on at most this many live workers at once
    dead: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.portions < self.workers:
            raise ValueError("portions must be >= workers")
        if self.static and self.portions != self.workers:
            raise ValueError("static portions: one per worker")
        self.busy: dict[int, tuple[int, int] | None] = {w: None for w in range(self.workers)}
        self.evaluation = -1
        self.counts = PortionCounts([0] * self.workers)
        self.done: set[int] = set()
        self.copies: dict[int, set[int]] = {}
        self.first_issue: dict[int, int] = {}
        self.todo: deque[int] = deque()
        self._issues = 0

    def begin(self, evaluation: int) -> None:
        self.evaluation = evaluation
        self.counts = PortionCounts([0] * self.workers)
        self.done = set()
        self.copies = {p: set() for p in range(self.portions)}
        self.first_issue = {}
        if self.static:  # a dead worker's own portion is up for grabs from the start
            self.todo = deque(p for p in range(self.portions) if p in self.dead)
        else:
            self.todo = deque(range(self.portions))

    @property
    def complete(self) -> bool:
        return len(self.done) == self.portions

    def live(self) -> list[int]:
        return [w for w in range(self.workers) if w not in self.dead]

    def assign(self) -> list[tuple[int, int]]:
        """(worker, portion) pairs to send now: one to every free live worker that has
        something to do."""
        out = []
        for w in self.live():
            if self.busy[w] is not None:
                continue
            p = self._pick(w)
            if p is None:
                continue
            if self.copies[p]:
                self.counts.backups_issued += 1
            self.copies[p].add(w)
            self.first_issue.setdefault(p, self._issues)
            self._issues += 1
            self.busy[w] = (self.evaluation, p)
            out.append((w, p))
        return out

    def _pick(self, w: int) -> int | None:
        if self.static and w not in self.first_issue and w not in self.done:
            return w  # its own portion, once per evaluation
        while self.todo:
            p = self.todo.popleft()
            if p not in self.done:
                return p
        if self.static:
            return None
        # backup task: the outstanding portion with the fewest live copies, oldest first
        outstanding = [p for p in range(self.portions) if p not in self.done
                       and w not in self.copies[p] and len(self.copies[p]) < self.max_copies]
        if not outstanding:
            return None
        return min(outstanding, key=lambda p: (len(self.copies[p]),
                                               self.first_issue.get(p, -1)))

    def finish(self, worker: int, evaluation: int, portion: int) -> bool:
        """A worker answered; True when it is the first answer for a portion of the current
        evaluation (its loss counts), False for a wasted one."""
        self.busy[worker] = None
        if evaluation != self.evaluation or not 0 <= portion < self.portions:
            self.counts.backups_wasted += 1
            return False
        self.copies[portion].discard(worker)
        if portion in self.done:
            self.counts.backups_wasted += 1
            return False
        self.done.add(portion)
        self.counts.portions_done[worker] += 1
        return True

    def lose(self, worker: int) -> None:
        """A worker is dead: its outstanding portion goes back to the queue (at the
        front) unless another live worker is already computing it."""
        if worker in self.dead:
            return
        self.dead.add(worker)
        job, self.busy[worker] = self.busy[worker], None
        if job is None or job[0] != self.evaluation:
            return
        p = job[1]
        self.copies[p].discard(worker)
        if p not in self.done and not self.copies[p]:
            self.todo.appendleft(p)
            self.counts.reissued += 1
