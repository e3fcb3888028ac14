"""How much of a CPU core each rank of a CPU job gets: the slowdown a job's step takes
when the ranks placed on a machine outnumber its cores.

A CPU job's rank runs one compute thread (the live launcher sets ``OMP_NUM_THREADS=1``).
Where the ranks of all running jobs on one machine exceed its cores, the kernel shares the
cores out and every step, its compute and its CPU-driven gloo collectives alike, stretches
by ``ranks / cores``. This is what a scheduler knows without measuring any job's speed:
its own placement, and the cores of each machine (declared in the topology, or this
machine's own for a one-machine test cluster whose servers are slots of it).

The learned throughput model (:mod:`phalanx.cluster.model.learned`) is fitted to step times
divided by the slowdown at the time they were measured, and predicts a set-up's step time
as the model's times the slowdown the job will have there. Without this, a job observed
at 1 and 2 workers on a 2-core machine was predicted 59% too fast at 4 (4 ranks share 2
cores); see ``docs/cluster.md``. GPU jobs compute on their devices: slowdown 1.

The simulator's ``PerfOptions.shared_cores`` is the same rule (``cores / busy``) on its
side.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from phalanx.cluster.core.topology import Topology


@dataclass(frozen=True)
class CoreShare:
    """Which machine each server is on (``host``: server index -> machine index) and the
    cores of each machine (``cores``)."""

    host: tuple[int, ...]
    cores: tuple[int, ...]

    @classmethod
    def this_machine(cls, topology: Topology, cores: int | None = None) -> CoreShare:
        """Every server a slot of this one machine (the local engine, a local Ray or
        Slurm cluster): all share its cores."""
        n = cores or os.cpu_count() or 1
        return cls(tuple(0 for _ in topology.servers), (n,))

    @classmethod
    def per_server(cls, topology: Topology) -> CoreShare:
        """Every server a machine of its own with the cores the topology declares."""
        return cls(tuple(range(len(topology.servers))),
                   tuple(s.cpu_cores for s in topology.servers))

    def demand(self, ranks_per_server: Iterable[tuple[int, int]]) -> list[int]:
        """Ranks per machine from ``(server, ranks)`` pairs (a server may repeat)."""
        out = [0] * len(self.cores)
        for server, ranks in ranks_per_server:
            out[self.host[server]] += ranks
        return out

    def slowdown(self, servers: Iterable[int], demand: list[int]) -> float:
        """The slowdown of a job on ``servers`` when each machine runs ``demand`` ranks in
        all (its own included): that of its most crowded machine, at least 1."""
        worst = 1.0
        for h in {self.host[s] for s in servers}:
            worst = max(worst, demand[h] / self.cores[h])
        return worst

    def predict(self, ranks: int, others: Mapping[int, int], per_server: int) -> float:
        """The slowdown a job would have on ``ranks`` ranks, packed ``per_server`` to a
        server onto the least crowded machines, beside the ranks ``others`` (machine ->
        ranks of the other running jobs) already there."""
        load = {h: others.get(h, 0) for h in range(len(self.cores))}
        free = {h: sum(1 for x in self.host if x == h) * per_server for h in load}
        left, worst = ranks, 1.0
        for h in sorted(load, key=lambda h: (load[h] / self.cores[h], h)):
            if left <= 0:
                break
            take = min(left, free[h]) if len(self.cores) > 1 else left
            left -= take
            worst = max(worst, (load[h] + take) / self.cores[h])
        return worst
