"""A shard's dense update on a thread of its own, overlapped with the server loop's next
receive (torch releases the GIL in its kernels).

Measured on a 1M-parameter shard (bench/ps.py): the update (the rule and ``p += u``) takes
~0.3 ms and a push's receive ~1 ms. In line, the loop posts the next receive only after
the update. Here the update runs meanwhile. The shard calls :meth:`Updater.settle`
before anything reads the weights or the rule's state (a pull's reply, the next update, a
checkpoint, the final model), so every value is what the in-line shard computes, bit for
bit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

# a dense slice this large is updated on the thread (~60 us of arithmetic, against a
# hand-over of ~30 us); a smaller one in line
OVERLAP_MIN = 1 << 17


class Updater:
    """Runs one update at a time, on a thread while :meth:`overlapped`, else in line."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._pool: ThreadPoolExecutor | None = None
        self.pending: Future | None = None  # the update still running on the thread

    @contextlib.contextmanager
    def overlapped(self) -> Iterator[None]:
        with ThreadPoolExecutor(1, thread_name_prefix=self.name) as pool:
            self._pool = pool
            try:
                yield
            finally:
                self._pool = None
                self.settle()

    def run(self, update: Callable[[], None], size: int) -> None:
        """``update()`` now, or on the thread when overlapped and ``size`` is large enough.
        The caller has settled the previous update (the rule's state is sequential)."""
        if self._pool is not None and size >= OVERLAP_MIN:
            self.pending = self._pool.submit(update)
        else:
            update()

    def settle(self) -> None:
        """Wait for the update in flight, if any; its error, if it failed, is raised here."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()
