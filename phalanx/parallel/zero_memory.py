"""What a rank of sharded data parallel holds, counted from its tensors, and the formula.

Counted at the end of each step's backward (the moment a step holds the most of the three:
the weights, the gradients, the rule's state before the update): the distinct storages of
the parameters and of this rank's weight shards, every ``.grad`` still held plus the
rank's reduced gradient shards, and every tensor of the rule's state. Activations are not
counted (the same under every stage).

The formula, per rank, for Psi parameters on N ranks, everything fp32, a rule that keeps
K bytes per parameter (Adam 8, momentum 4, SGD 0):

| stage | parameters | gradients | rule state |
|---|---|---|---|
| sync (DDP) | 4 Psi | 4 Psi | K Psi |
| 1 | 4 Psi | 4 Psi + 4 Psi / N | K Psi / N |
| 2 | 4 Psi | 4 Psi / N | K Psi / N |
| 3 | 4 Psi / N | 4 Psi / N | K Psi / N |

Stage 1 holds the whole gradient through backward and its reduced shard (4 Psi / N) beside
it. The ZeRO paper's Table 1 counts mixed precision instead (2 Psi fp16 weights, 2 Psi fp16
gradients, K = 12 with the fp32 master copy); phalanx's fp32 runs are held to the table
above, its ``--precision bf16`` runs to bf16 weights and gradients (2 Psi each where whole)
beside fp32 master and summed-gradient shards (4 Psi / N each): docs/memory.md. Each unit
is padded to a multiple of N values, so the counts exceed the formula by at most (N - 1)
values per unit and array.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from phalanx.rules import state_tensors

COMPONENTS = ("params", "grads", "optimizer")


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class Held:
    """Bytes one rank holds: parameters, gradients, the rule's state."""

    params: int
    grads: int
    optimizer: int

    def gathered(self) -> dict[str, Any]:
        """Every rank's counts (a collective: every rank calls it): the largest rank's per
        component, and each rank's total."""
        mine = torch.tensor([self.params, self.grads, self.optimizer], dtype=torch.float64)
        world = dist.get_world_size() if dist.is_initialized() else 1
        every = [torch.zeros_like(mine) for _ in range(world)]
        if world > 1:
            dist.all_gather(every, mine)  # bookkeeping, not counted as traffic
        else:
            every = [mine]
        table = torch.stack(every)
        out = {f"held_{c}_bytes": int(table[:, i].max()) for i, c in enumerate(COMPONENTS)}
        out["held_bytes_per_rank"] = [int(v) for v in table.sum(dim=1)]
        return out


def held(hooks) -> Held:
    """What ``hooks`` (a :class:`~phalanx.parallel.zero.ZeroHooks`) holds now."""
    storages: dict[int, int] = {}
    for t in [*hooks.params, *hooks.shards]:
        st = t.untyped_storage()
        if st.nbytes():
            storages[st.data_ptr()] = st.nbytes()
    grads = sum(_nbytes(p.grad) for p in hooks.params if p.grad is not None)
    grads += sum(_nbytes(g) for g in hooks.grads)
    return Held(params=sum(storages.values()), grads=grads,
                optimizer=sum(_nbytes(t) for t in state_tensors(hooks.state)))


def state_bytes_per_value(rule) -> int:
    """K: the bytes of rule state one more fp32 parameter costs (Adam 8, momentum 4, SGD 0;
    a step counter the rule keeps is the same for any size and left out)."""
    def size(n: int) -> int:
        return sum(_nbytes(t) for t in state_tensors(rule.init([torch.zeros(n)])))

    return size(2) - size(1)


def formula(cfg, hooks) -> dict[str, int]:
    """The table of the module, for this run: ``formula_*_bytes``."""
    psi = sum(p.numel() for p in hooks.params)
    n, stage = hooks.world, hooks.stage
    k = state_bytes_per_value(hooks.rule)
    if hooks.precision.mixed:  # bf16 weights and gradients; fp32 masters and summed shard
        parts = {"params": (2 * psi if stage < 3 else 0) + 4 * psi // n,
                 "grads": (2 * psi if stage == 1 else 0) + 4 * psi // n,
                 "optimizer": k * psi // n}
    else:
        parts = {"params": 4 * psi if stage < 3 else 4 * psi // n,
                 "grads": 4 * psi + 4 * psi // n if stage == 1 else 4 * psi // n,
                 "optimizer": k * psi // n}
    out = {f"formula_{c}_bytes": v for c, v in parts.items()}
    out["formula_bytes"] = sum(parts.values())
    return out
