"""``--memory-limit BYTES``: a per-rank memory budget, enforced by the kernel.

Each rank process, before it builds its model (:func:`phalanx.runtime.placement.setup_rank`),
caps its address space with ``setrlimit(RLIMIT_AS)`` at what it has mapped then plus
BYTES. What it has mapped then is its start-up: the interpreter, torch's libraries (most
of them mapped, not resident), the data set and the process group; the budget is what
training may add: the model, its gradients, the rule's state, activations, communication
buffers. An allocation past it fails in the process that made it (``mmap`` returns
ENOMEM: torch raises "can't allocate memory", Python ``MemoryError``), and
:func:`explain` turns that failure into one line naming the limit
(:class:`MemoryLimitExceeded`), which the launcher reports as the rank's failure.

Address space, not resident memory: a budget counts every mapping a rank makes (a
thread's stack reservation, an allocator arena), so it is an upper bound on what the
rank can touch, as a cgroup's would be on what it does touch. Process-wide, as the
limit itself: the value recorded here is the one the kernel enforces.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

from phalanx.errors import PhalanxError

# what an allocation that the address-space limit refused looks like, by library
_ALLOC_FAILED = ("can't allocate memory", "cannot allocate memory", "out of memory",
                 "std::bad_alloc", "can't start new thread",
                 # torch.save's zip writer when its buffer could not grow (the checkpoint
                 # of a rank under the limit: "unexpected pos N vs M", measured)
                 "enforce fail at inline_container.cc")


class MemoryLimitExceeded(PhalanxError):
    """An allocation past ``--memory-limit`` (one line)."""


@dataclass(frozen=True)
class Budget:
    """The limit this process runs under: ``budget`` bytes beyond ``base`` (mapped when
    it was set)."""

    budget: int
    base: int

    @property
    def limit(self) -> int:
        return self.base + self.budget


_applied: list[Budget] = []  # this process's (the kernel's limit is process-wide too)


def mapped_bytes() -> int:
    """This process's address space now (``VmSize``), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmSize in /proc/self/status")


def apply(budget: int) -> Budget:
    """Cap this process's address space at what it maps now plus ``budget`` bytes."""
    base = mapped_bytes()
    b = Budget(budget, base)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY and b.limit > hard:
        raise MemoryLimitExceeded(f"--memory-limit {budget}: above this machine's hard "
                                  f"address-space limit ({hard} bytes)")
    resource.setrlimit(resource.RLIMIT_AS, (b.limit, hard))
    _applied[:] = [b]
    return b


def explain(e: BaseException, rank: int) -> BaseException:
    """``e`` as one line naming the limit when it is an allocation the limit refused;
    else ``e`` itself."""
    if not _applied or isinstance(e, PhalanxError):
        return e
    text = str(e).lower()
    if not (isinstance(e, MemoryError) or any(s in text for s in _ALLOC_FAILED)):
        return e
    b = _applied[0]
    return MemoryLimitExceeded(
        f"--memory-limit {b.budget}: rank {rank} ran out of its budget ({b.budget:,} bytes "
        f"beyond the {b.base:,} it had mapped at start-up; RLIMIT_AS {b.limit:,}): "
        f"{type(e).__name__}")
