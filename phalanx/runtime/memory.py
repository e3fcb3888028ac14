"""The C allocator of a process that receives large messages in a loop (a parameter-server
shard).

Every received payload is a fresh tensor (the receiver owns it; a shard may keep it in a
buffer). glibc's ``malloc`` adapts its thresholds as blocks come and go: small blocks
freed between two 4 MB receives split the freed 4 MB block, the next one is cut from the
top of the heap, and the top is trimmed back to the kernel when it grows past twice the
threshold. Each 4 MB receive then touches new pages. Measured on a 1M-parameter shard
(bench/ps.py's push loop): ~650 page faults and ~1.9 ms of kernel time per push, against
~27 faults with fixed thresholds; pushes/s went from ~340 to ~600.

Fixed thresholds keep blocks up to :data:`MMAP_THRESHOLD` in the heap and freed memory up
to :data:`TRIM_THRESHOLD` in the process, so receive buffers are reused. The process's
peak memory is unchanged: it only gives memory back to the kernel later.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 256 << 20  # blocks below this come from the heap (glibc's cap: 32 MiB)
TRIM_THRESHOLD = 512 << 20  # free memory kept at the heap's top before it is given back


def keep_freed_memory() -> bool:
    """Fix this process's allocator thresholds (see the module). False where the C
    library has no ``mallopt`` (not glibc): nothing changes there."""
    try:
        # the process's own symbols (find_library would start a subprocess to look)
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
