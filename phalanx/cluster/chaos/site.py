"""Where a chaos schedule runs (:class:`Site`): this machine's slots (``--engine local``) or
a Ray cluster of three test hosts (``--engine ray``: the harness starts the nodes as
``tests/cluster/test_ray_live.py`` does and runs ``phalanx schedule --engine ray
--ray-address ...`` inside host 0, as a user would)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from phalanx.cluster.chaos.hostfaults import HostKeeper
from phalanx.cluster.chaos.jobs import CLUSTER, JobKind, kinds_for
from phalanx.cluster.chaos.raycluster import (
    TOPOLOGY,
    RayTestCluster,
    ray_env,
    ray_test_cluster,
    wait_until,
)

READY_S = 120.0        # every node up, no host fault outstanding, before a run starts
ACTORS_GONE_S = 15.0   # a finished scheduler's actors leave within this


@dataclass
class Site:
    """The cluster a schedule is given, the flags that name its engine, and on Ray the
    test cluster and the keeper of its nodes."""

    engine: str
    cluster: str
    root: Path
    ray: RayTestCluster | None = None
    keeper: HostKeeper | None = None

    @property
    def catalog(self) -> tuple[JobKind, ...]:
        return kinds_for(self.engine)

    def flags(self) -> list[str]:
        return ["--engine", "ray", "--ray-address", self.ray.address] if self.ray else []

    def argv(self, command: list[str]) -> list[str]:
        """``command`` as the site runs it (inside host 0 on Ray: ``ip netns exec`` execs
        it, so the process started is the scheduler itself)."""
        return self.ray.net.hosts[0].argv(command) if self.ray else command

    def env(self, tmp: Path) -> dict[str, str]:
        """The scheduler's environment: its private temp folder, this tree's phalanx."""
        base = ray_env(self.root) if self.ray else dict(os.environ)
        path = os.pathsep.join(filter(None, [str(self.root), os.environ.get("PYTHONPATH")]))
        return {**base, "TMPDIR": str(tmp), "PYTHONPATH": path}

    def hosts(self) -> dict[str, int]:
        """Each test host's network namespace ('net:[inode]') -> its index ({} locally)."""
        return {h.netns(): i for i, h in enumerate(self.ray.net.hosts)} if self.ray else {}

    def ready(self) -> list[str]:
        """Wait until every node is up and no host fault is outstanding; what is not."""
        if self.ray is None:
            return []
        c, k = self.ray, self.keeper
        ok = wait_until(lambda: not k.busy() and all(
            c.raylet(i) is not None for i in range(len(c.net.hosts))), READY_S)
        return [] if ok else [f"the Ray nodes were not all up within {READY_S:g} s"]

    def actors_left(self) -> list[str]:
        """Device actors still on the hosts once the schedule ended (Ray ends a driver's
        actors when it exits; ours stops them itself at its end)."""
        if self.ray is None:
            return []
        deadline = time.monotonic() + ACTORS_GONE_S
        while self.ray.actors() and time.monotonic() < deadline:
            time.sleep(0.2)
        return [f"a device actor left running ({a})" for a in self.ray.actors()]


@contextlib.contextmanager
def site_for(engine: str, root: Path) -> Iterator[Site]:
    """The site of ``engine``; on Ray a fresh cluster of test hosts and its keeper, both
    ended on every exit path."""
    if engine == "local":
        yield Site("local", CLUSTER, root)
        return
    with ray_test_cluster(root, TOPOLOGY) as c:
        keeper = HostKeeper(c)
        keeper.start()
        try:
            yield Site("ray", TOPOLOGY, root, c, keeper)
        finally:
            keeper.stop()
