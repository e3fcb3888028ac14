"""The live engines: what carries out the scheduler's starts and stops. Each is one module
with its executor (:class:`~phalanx.cluster.live.engines.base.Executor`) and a factory;
adding one is its module plus one line in ``ENGINES``."""

from __future__ import annotations

from phalanx.catalog import Catalog
from phalanx.cluster.live.engines.base import EngineFactory
from phalanx.cluster.live.engines.local import local_engine
from phalanx.cluster.live.engines.ray import ray_engine
from phalanx.cluster.live.engines.slurm import slurm_engine

ENGINES: Catalog[EngineFactory] = Catalog("engine", "--engine")
ENGINES.add("local", local_engine, "every device is a slot on this machine")
ENGINES.add("ray", ray_engine, "one Ray node per server")
ENGINES.add("slurm", slurm_engine, "one Slurm node per server")
