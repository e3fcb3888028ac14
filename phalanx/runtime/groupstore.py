"""A fresh store for each torchrun group, hosted by rank 0 on its own gloo address.

torchrun's agent store outlives a group: keys of a dead attempt stay in it, and gloo's
address keys do not name the attempt, so a restarted rank could read a dead peer's address.
A per-attempt key prefix fixes that only while every node agrees on the attempt number, and
they do not when a replacement machine joins (its agent starts at attempt 0 while the
survivors' are at 1). So rank 0 of every group starts a store of its own and publishes its
address in the agent store; the others connect to it. A stale address (the previous
group's rank 0, dead with its group) refuses connections, and they read the key again.
The attempt the group runs as is the highest any of its ranks was started with.
"""

from __future__ import annotations

import datetime
import os
import socket
import time

import torch.distributed as dist

from phalanx.errors import PhalanxError

KEY = "phalanx/group-store"


def open_group_store(agent_store: dist.Store, rank: int, world: int, addr: str,
                     timeout_s: float) -> dist.Store:
    """Rank 0 hosts (listening on ``addr`` only, never every interface); the others join."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((addr, 0))
        listener.listen(world + 1)
        port = listener.getsockname()[1]
        store = dist.TCPStore(addr, port, world, is_master=True, timeout=timeout,
                              wait_for_workers=False, master_listen_fd=listener.fileno())
        listener.detach()  # the store owns (and closes) the descriptor now
        agent_store.set(KEY, f"{addr} {port} {os.getpid()}")
        return store
    deadline = time.monotonic() + timeout_s
    while True:
        host, port, _ = agent_store.get(KEY).decode().split()
        try:
            store = dist.TCPStore(host, int(port), world, is_master=False,
                                  timeout=datetime.timedelta(seconds=2))
            store.set_timeout(timeout)
            return store
        except (RuntimeError, OSError):  # DistNetworkError is a RuntimeError
            if time.monotonic() > deadline:
                raise PhalanxError(f"rank {rank}: rank 0's store at {host}:{port} did not "
                                   f"answer in {timeout_s:g} s") from None
            time.sleep(0.2)


def own_store(rank: int, world: int, master: str, port: int, addr: str,
              timeout_s: float) -> dist.Store:
    """Without torchrun's shared agent store (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``):
    rank 0 hosts the group's store at torchrun's MASTER_PORT on its own address only (torch's
    env:// would listen on every interface), the others connect to MASTER_ADDR."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((addr, port))
        listener.listen(world + 1)
        store = dist.TCPStore(addr, port, world, is_master=True, timeout=timeout,
                              wait_for_workers=False, master_listen_fd=listener.fileno())
        listener.detach()
        return store
    return dist.TCPStore(master, port, world, is_master=False, timeout=timeout)


def agreed_attempt(store: dist.Store, rank: int, world: int, attempt: int) -> int:
    """The highest attempt number among the group's ranks (a sync point)."""
    store.set(f"phalanx/attempt/{rank}", str(attempt))
    return max(int(store.get(f"phalanx/attempt/{r}")) for r in range(world))
