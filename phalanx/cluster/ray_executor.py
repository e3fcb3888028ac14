"""The Ray backend: each rank is a Ray actor, pinned by a placement group to the node of the
device the scheduler gave it, that starts the rank's process itself.

* **Placement is ours.** Every node declares one custom resource per device it holds,
  ``phx_dev_<global device id>`` = 1 (a local cluster is built that way from the
  topology; a real cluster's nodes are started with ``ray start --resources``, see
  docs/cluster.md). A gang reserves one bundle per rank holding exactly its devices'
  resources, all or nothing (a placement group), so Ray can put a bundle on one node only:
  the one the scheduler chose. Ray does not decide anything.
* **Devices are ours.** The rank's process gets ``CUDA_VISIBLE_DEVICES`` from the devices
  we assigned, numbered on their node; the actor asks Ray for no GPU (Ray would renumber
  them and set its own ``CUDA_VISIBLE_DEVICES``).
* **Processes are ours.** The actor starts ``python -m phalanx.entry.torchrun ...`` in a
  new process group (:class:`~phalanx.cluster.executor.RankProcess`) and stops it itself
  (SIGTERM to the group, SIGKILL after the grace period) before the actor is killed: Ray
  can leave an actor's children behind. Actors run several calls at once
  (``max_concurrency``) so ``stop`` is answered while ``wait`` blocks on the rank.
* The node a rank ran on is what Ray reports to the actor (its node's
  ``phalanx.server`` label), handed to the rank, which records it (rank records).

``ray`` is an optional extra (``pip install -e '.[ray]'``); it is imported only when
``--engine ray`` is used.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from phalanx.cluster.executor import (
    Gang,
    RankProcess,
    failed_rank,
    free_port,
    gang_exit,
    local_world,
    rank_env,
)
from phalanx.cluster.topology import Topology
from phalanx.errors import ConfigError

DEVICE = "phx_dev_{}"                # custom resource of one device (global id)
LABELS = ("phalanx.zone", "phalanx.rack", "phalanx.server")
NODE_LABEL = "phalanx.server"
OBJECT_STORE = 80 * 2**20            # Ray's minimum is 75 MiB; ranks pass no objects
START_TIMEOUT_S = 120.0
LOCAL_ENV = ("RAY_USAGE_STATS_ENABLED", "RAY_TMPDIR", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")


def import_ray() -> ModuleType:
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ConfigError("--engine ray needs Ray: install the 'ray' extra "
                          "(pip install -e '.[ray]')") from None


def node_resources(topology: Topology, server: int) -> dict[str, float]:
    s = topology.servers[server]
    return {DEVICE.format(d): 1.0 for d in range(s.first_device,
                                                 s.first_device + s.num_devices)}


def node_labels(topology: Topology, server: int) -> dict[str, str]:
    s = topology.servers[server]
    return dict(zip(LABELS, (str(s.zone), str(s.rack), s.name)))


@contextlib.contextmanager
def ray_cluster(topology: Topology, address: str = "") -> Iterator[str]:
    """The address of the cluster to schedule on: ``address`` as given, or a local cluster
    with one Ray node per server of ``topology``, all on 127.0.0.1, no dashboard, its
    temp folder removed afterwards."""
    if address:
        if address.split(":")[0] in ("127.0.0.1", "localhost"):
            # a one-machine cluster: keep Ray from resolving loopback to a network address
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        yield address
        return
    tmp = tempfile.mkdtemp(prefix="phalanx-ray-")
    saved = {k: os.environ.get(k) for k in LOCAL_ENV}
    # Nothing leaves this machine. Every file Ray writes (sessions, sockets, the address
    # file it would put in /tmp/ray) goes to our folder, removed below. Ray resolves a
    # 127.0.0.1 cluster address to this host's network address unless it believes it runs
    # a one-machine (Windows / macOS style) cluster: read when ray is imported, so set first
    os.environ.update(RAY_USAGE_STATS_ENABLED="0", RAY_TMPDIR=tmp,
                      RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    import_ray()
    from ray.cluster_utils import Cluster  # noqa: PLC0415 - the optional extra

    cluster = None
    try:
        def args(server: int) -> dict[str, Any]:
            return dict(num_cpus=0, num_gpus=0, node_ip_address="127.0.0.1",
                        include_dashboard=False, object_store_memory=OBJECT_STORE,
                        resources=node_resources(topology, server),
                        labels=node_labels(topology, server))

        cluster = Cluster(initialize_head=True, head_node_args=args(0))
        for s in range(1, len(topology.servers)):
            cluster.add_node(**args(s))
        yield cluster.address
    finally:
        ray = import_ray()
        if ray.is_initialized():
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class RankActor:
    """One rank (made a Ray actor by :class:`RayExecutor`)."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.proc: RankProcess | None = None

    def node(self) -> tuple[str, str]:
        """(the node's ``phalanx.server`` label, or its Ray id; its IP address)."""
        ray = import_ray()
        ctx = ray.get_runtime_context()
        labels = ctx.get_node_labels() or {}
        return labels.get(NODE_LABEL, ctx.get_node_id()), ray.util.get_node_ip_address()

    def free_port(self, addr: str) -> int:
        return free_port(addr)

    def start(self, argv: tuple[str, ...], env: dict[str, str], log: str, cwd: str,
              hold_term: bool) -> int:
        os.chdir(cwd)   # the scheduler's folder: relative paths in a job's settings hold
        self.proc = RankProcess(self.python, tuple(argv), env, Path(log), hold_term)
        return self.proc.pid

    def wait(self) -> int:
        """Blocks (in one of the actor's threads) until the rank's process is gone."""
        assert self.proc is not None
        while True:
            rc = self.proc.poll()
            if rc is not None:
                return rc
            time.sleep(0.05)

    def stop(self, grace_s: float) -> None:
        if self.proc is not None:
            self.proc.stop(grace_s)   # ``wait``'s polling sends SIGKILL after the grace

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()


class _RayGang:
    def __init__(self, actors: list[Any], waits: list[Any], pg: Any) -> None:
        self.actors, self.waits, self.pg = actors, waits, pg
        self.codes: list[int | None] = [None] * len(actors)


class RayExecutor:
    """Gangs as Ray actors on the nodes the scheduler chose."""

    name = "ray"

    def __init__(self, topology: Topology, address: str, python: str) -> None:
        self.ray = ray = import_ray()
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     namespace="phalanx", logging_level=logging.WARNING)
        have = ray.cluster_resources()
        missing = [DEVICE.format(d) for d in range(topology.num_devices)
                   if have.get(DEVICE.format(d), 0) < 1]
        if missing:
            raise ConfigError(
                f"--ray-address {address}: the cluster lacks device resources for --cluster "
                f"{topology.name} ({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}"
                "); start each node with ray start --resources (docs/cluster.md)")
        self.python = python
        self.actor = ray.remote(RankActor)
        self.gangs: dict[str, _RayGang] = {}

    def start(self, gang: Gang) -> None:
        ray = self.ray
        from ray.util.placement_group import placement_group  # noqa: PLC0415
        from ray.util.scheduling_strategies import (  # noqa: PLC0415
            PlacementGroupSchedulingStrategy,
        )

        slots = gang.ranks if gang.per_rank else gang.ranks[:1]
        bundles = [{DEVICE.format(d): 1.0 for d in s.devices} for s in slots]
        pg = placement_group(bundles, strategy="PACK")
        actors: list[Any] = []
        try:
            ray.get(pg.ready(), timeout=START_TIMEOUT_S)
            actors = [self.actor.options(
                num_cpus=0, num_gpus=0, max_concurrency=4,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=i)).remote(self.python)
                for i in range(len(slots))]
            nodes = ray.get([a.node.remote() for a in actors], timeout=START_TIMEOUT_S)
            ip0 = nodes[0][1]
            master = (ip0, ray.get(actors[0].free_port.remote(ip0)))
            lw = local_world(gang, master[0])
            cwd = os.getcwd()
            ray.get([a.start.remote(gang.argv, rank_env(gang, s, master, node, lw, s.local),
                                    str(gang.log), cwd, gang.per_rank)
                     for a, s, (node, _) in zip(actors, slots, nodes)],
                    timeout=START_TIMEOUT_S)
        except Exception as e:   # noqa: BLE001 - any Ray failure: nothing may stay behind
            self._release(actors, pg)
            raise OSError(f"ray: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from None
        self.gangs[gang.job] = _RayGang(actors, [a.wait.remote() for a in actors], pg)

    def poll(self, job: str) -> int | None:
        g = self.gangs[job]
        pending = [w for w, c in zip(g.waits, g.codes) if c is None]
        ready, _ = self.ray.wait(pending, num_returns=len(pending), timeout=0)
        for w in ready:
            g.codes[g.waits.index(w)] = self.ray.get(w)
        if failed_rank(g.codes):
            for a, c in zip(g.actors, g.codes):
                if c is None:
                    a.stop.remote(2.0)
        rc = gang_exit(g.codes)
        if rc is not None:
            del self.gangs[job]
            self._release(g.actors, g.pg)
        return rc

    def stop(self, job: str, grace_s: float) -> None:
        g = self.gangs.get(job)
        if g is not None:
            for a in g.actors:
                a.stop.remote(grace_s)

    def _release(self, actors: list[Any], pg: Any) -> None:
        ray = self.ray
        from ray.util.placement_group import remove_placement_group  # noqa: PLC0415

        with contextlib.suppress(Exception):
            # our processes first: Ray may leave an actor's children behind
            ray.get([a.kill.remote() for a in actors], timeout=30)
        for a in actors:
            with contextlib.suppress(Exception):
                ray.kill(a)
        with contextlib.suppress(Exception):
            remove_placement_group(pg)

    def close(self) -> None:
        for job in list(self.gangs):
            g = self.gangs.pop(job)
            self._release(g.actors, g.pg)
