"""``--policy pollux`` on a cluster of several GPU types, as the Sia artifact ran it
(siasosp23/artifacts, ``sia-simulator/multi_simulator_unaware.py``): Pollux sees one
homogenised cluster and one throughput model per job over every type it ran on; each job
then keeps the GPUs of the type that holds most of its allocation (the artifact's repair,
dropping the rest).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from phalanx.cluster.core.view import Choice, JobView
from phalanx.cluster.model.learned import Learner
from phalanx.cluster.policies.pollux import PolluxPolicy

# types kept when a homogenised allocation ties (``fix_allocations_by_dropping``)
UNAWARE_KEEP = {"dgx-ext": 0, "azure": 1, "quad": 2, "rtx": 3, "aws": 4}


@dataclass
class UnawarePolluxPolicy(PolluxPolicy):
    """``--policy pollux`` on a cluster of several GPU types (module doc), as
    ``multi_simulator_unaware.py`` builds it: virtual nodes of the smallest server's GPUs
    (an 8-GPU server is two 4-GPU ones), no job above the smallest type's GPUs, Pollux's
    search over them as one type, then each job keeps only the servers of the type that
    holds most of its GPUs. ``node_sizes`` are the virtual nodes'."""

    vnode_server: tuple[int, ...] = ()     # the real server of each virtual node
    server_types: tuple[str, ...] = ()
    max_gpus: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        self.learner.max_gpus = self.max_gpus

    def learner_for(self, device_type: str) -> Learner:
        return self.learner          # one model per job over every type (unaware)

    def allocate(self, jobs: Sequence[JobView], capacity: int, now: float, *,
                 held: Mapping[str, int] | None = None) -> dict[int, Choice]:
        # the views' placements in virtual nodes: a job's GPUs on a server fill its first
        # virtual node, then the next
        first = {}
        for vn, s_ in enumerate(self.vnode_server):
            first.setdefault(s_, vn)
        size = self.node_sizes[0]
        vjobs = []
        for v in jobs:
            vp = []
            for s_, k in v.placement:
                vn = first[s_]
                while k > 0:
                    vp.append((vn, min(k, size)))
                    k -= size
                    vn += 1
            vjobs.append(replace(v, placement=tuple(vp)))
        out = super().allocate(vjobs, capacity, now, held=held)
        fixed = {}
        for jid, c in out.items():
            if not c.servers:
                fixed[jid] = c
                continue
            per_server: dict[int, int] = {}
            for vn, k in c.servers:
                s_ = self.vnode_server[vn]
                per_server[s_] = per_server.get(s_, 0) + k
            per: dict[str, int] = {}
            for s_, k in per_server.items():
                per[self.server_types[s_]] = per.get(self.server_types[s_], 0) + k
            keep = min(per, key=lambda t: (-per[t], UNAWARE_KEEP.get(t, 9), t))
            servers = tuple(sorted((s_, k) for s_, k in per_server.items()
                                   if self.server_types[s_] == keep))
            fixed[jid] = Choice(sum(k for _, k in servers), None, servers, keep)
        return fixed


def unaware_layout(server_sizes: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(virtual node sizes, real server of each virtual node): servers cut into nodes of
    the smallest server's size."""
    size = min(server_sizes)
    sizes, owner = [], []
    for s_, g in enumerate(server_sizes):
        for _ in range(g // size):
            sizes.append(size)
            owner.append(s_)
    return tuple(sizes), tuple(owner)
