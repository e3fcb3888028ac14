"""The local engine: every device of the topology is a slot of this machine, and a rank is
a child process of the scheduler."""

from __future__ import annotations

import contextlib
import sys

from phalanx.cluster.core.topology import Topology
from phalanx.cluster.live.engines.base import (
    EngineOptions,
    Executor,
    Gang,
    RankProcess,
    failed_rank,
    free_port,
    gang_exit,
    local_world,
    note_failure,
    rank_env,
)


class LocalExecutor:
    """Every slot is on this machine: ranks are children of the scheduler, and a slot's
    global device id is its CUDA device number (``uniform:1,1,2,2`` on a 4-GPU host)."""

    name = "local"

    def __init__(self, python: str = sys.executable, master_addr: str = "127.0.0.1") -> None:
        # ``master_addr``: the address rank 0 is told to serve at (an engine such as Ray
        # hands out the node's network address even when every rank is on one machine)
        self.python, self.master_addr = python, master_addr
        self.gangs: dict[str, list[RankProcess]] = {}
        self.failed: dict[str, tuple[tuple[int, int], ...]] = {}

    def start(self, gang: Gang) -> None:
        try:
            port = free_port(self.master_addr)
        except OSError:   # not this host's address: rank 0 says so at once (netif)
            port = free_port("0.0.0.0")
        master = (self.master_addr, port)
        lw = local_world(gang, master[0])
        procs: list[RankProcess] = []
        slots = gang.ranks if gang.per_rank else gang.ranks[:1]
        try:
            for slot in slots:
                procs.append(RankProcess(self.python, gang.argv,
                                         rank_env(gang, slot, master, slot.node, lw,
                                                  slot.devices), gang.log, gang.per_rank))
        except OSError:
            for p in procs:
                p.kill()
            raise
        self.gangs[gang.job] = procs

    def poll(self, job: str) -> int | None:
        procs = self.gangs[job]
        codes = [p.poll() for p in procs]
        note_failure(self.failed, job, codes)
        if failed_rank(codes):
            for p, c in zip(procs, codes):
                if c is None:
                    p.stop(2.0)
        rc = gang_exit(codes)
        if rc is not None:
            del self.gangs[job]
        return rc

    def stop(self, job: str, grace_s: float) -> None:
        for p in self.gangs.get(job, []):
            p.stop(grace_s)

    def down(self) -> frozenset[str]:
        return frozenset()    # this machine is every server: it is never lost alone

    def close(self) -> None:
        for procs in self.gangs.values():
            for p in procs:
                p.kill()
        self.gangs.clear()


def local_engine(topology: Topology, options: EngineOptions,
                 stack: contextlib.ExitStack) -> Executor:
    return LocalExecutor(options.python)
