"""The Slurm engine: every rank is a Slurm batch job pinned to its node and device
(:mod:`.executor`), on an existing partition or a local cluster (:mod:`.local`)."""

from __future__ import annotations

import contextlib

from phalanx.cluster.core.topology import Topology
from phalanx.cluster.live.engines.base import EngineOptions, Executor
from phalanx.cluster.live.engines.slurm.executor import SlurmExecutor
from phalanx.cluster.live.engines.slurm.local import slurm_cluster


def slurm_engine(topology: Topology, options: EngineOptions,
                 stack: contextlib.ExitStack) -> Executor:
    """``--slurm-partition`` of the existing cluster, or a local one built from
    ``topology``."""
    target = stack.enter_context(slurm_cluster(topology, options.slurm_partition))
    return SlurmExecutor(topology, target, options.python)
