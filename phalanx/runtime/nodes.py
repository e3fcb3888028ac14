"""Which node each rank of a torchrun group lives on, so a failure can name the lost node.

When a machine dies, its peers' gloo calls fail with messages such as "Connection closed by
peer [10.0.0.2]:41349" or "Connection reset by peer", or time out. Each rank publishes its
node (torchrun's GROUP_RANK) and gloo address in the store right after the group forms and
keeps the table in memory (the store may live on the node that is lost); the entry point
turns a failure into one line naming the node behind the address in the message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch.distributed as dist

_IPV4 = re.compile(r"\b(\d{1,3}(?:\.\d{1,3}){3})\b")


@dataclass(frozen=True)
class RankPlace:
    rank: int
    node: int  # torchrun's GROUP_RANK
    addr: str  # the address its gloo device binds


@dataclass(frozen=True)
class NodeTable:
    places: tuple[RankPlace, ...]

    def node_of_addr(self, addr: str) -> int | None:
        nodes = {p.node for p in self.places if p.addr == addr}
        return nodes.pop() if len(nodes) == 1 else None

    def ranks_of(self, node: int) -> list[int]:
        return [p.rank for p in self.places if p.node == node]

    def addr_of(self, node: int) -> str:
        return next(p.addr for p in self.places if p.node == node)

    def describe(self, node: int) -> str:
        ranks = self.ranks_of(node)
        span = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"
        return f"node {node} ({self.addr_of(node)}, {span})"

    def failure_line(self, rank: int, error: BaseException) -> str:
        """One line: which node failed (when the error names a peer's address) and why."""
        text = str(error).strip() or type(error).__name__
        first = next((ln for ln in text.splitlines() if "Error" in ln or "error" in ln),
                     text.splitlines()[0])
        # gloo's source-file prefix and its advice add nothing to the line
        first = first.strip().split("] ", 1)[-1].split(". This is typically", 1)[0][:300]
        me = next((p.node for p in self.places if p.rank == rank), None)
        for addr in _IPV4.findall(text):
            node = self.node_of_addr(addr)
            if node is not None and node != me:
                return (f"lost {self.describe(node)}: rank {rank} on node {me} saw: {first}")
        return f"rank {rank} on node {me} failed: {first}"


def publish(store: dist.Store, rank: int, world: int, node: int, addr: str) -> NodeTable:
    """Every rank writes where it is and reads everyone's (a sync point: waits for all)."""
    store.set(f"phalanx/place/{rank}", f"{node} {addr}")
    places = []
    for r in range(world):
        n, a = store.get(f"phalanx/place/{r}").decode().split()
        places.append(RankPlace(r, int(n), a))
    return NodeTable(tuple(places))
