"""The Ray backend: each rank is a Ray actor, pinned by a placement group to the node of the
device the scheduler gave it, that starts the rank's process itself.

* **Placement is ours.** Every node declares one custom resource per device it holds,
  ``phx_dev_<global device id>`` = 1, and its devices' type, ``phx_type_<type>`` = their
  count (checked against the topology at start; a local cluster is built that way from the
  topology; a real cluster's nodes are started with ``ray start --resources``, see
  docs/cluster.md). Each device gets a placement group of one bundle holding exactly its
  resource, so Ray can put it on one node only: the device's; the device's actor lives in
  it and runs every rank the scheduler puts on that device. Ray decides nothing; the gang
  is all-or-nothing in our allocator.
* **Devices are ours.** The rank's process gets ``CUDA_VISIBLE_DEVICES`` from the devices
  we assigned, numbered on their node; the actor asks Ray for no GPU (Ray would renumber
  them and set its own ``CUDA_VISIBLE_DEVICES``).
* **Processes are ours.** The actor starts ``python -m phalanx.entry.torchrun ...`` in a
  new process group (:class:`~phalanx.cluster.live.engines.base.RankProcess`) and stops it itself
  (SIGTERM to the group, SIGKILL after the grace period) before the actor is killed: Ray
  can leave an actor's children behind. Actors run several calls at once
  (``max_concurrency``) so ``stop`` is answered while ``wait`` blocks on the rank.
* The node a rank ran on is what Ray reports to the actor (its node's
  ``phalanx.server`` label), handed to the rank, which records it (rank records).
* **Lost nodes.** A server is down while no live node of the cluster declares one of its
  device resources (``ray.nodes()``, read at most every :data:`NODES_EVERY_S`): its raylet
  died, or the node left. Its devices' actors died with it (their rank's wait answers with
  an actor error, read as a SIGKILL); they are dropped, and created again on the node that
  declares the devices when it comes back (``ray start --address`` with the same
  ``--resources``). The live loop reads :meth:`RayExecutor.down`. A crashed node's actors
  are found dead (and its ranks' peers fail) seconds before the cluster calls the node
  dead, so a dead actor's rank counts as ended only once its node is down or after
  :func:`verdict_s`: the loop then sees a lost server, not a failed job.
* **Cut-off nodes.** A node cut off by a network partition is silent, not dead: the GCS
  calls it dead only when its health check has run out on every try (its timeout each
  time; :class:`~phalanx.cluster.live.engines.ray_cluster.HealthCheck`), and its ranks run
  on. Each device's actor therefore holds a lease on its node's life
  (:mod:`~phalanx.cluster.live.engines.ray_fence`): it kills its rank when the GCS has
  not said "alive" for half the soonest verdict, or says "dead". The cut-off ranks are gone
  before the job starts elsewhere (fenced: a lost node's rank counts as ended only once
  its lease has surely run out, :func:`ray_fence.dead_rank_ended`), and no rank across the
  cut waits out gloo's timeout: the loop stops them when the node is lost.

``ray`` is an optional extra (``pip install -e '.[ray]'``); it is imported only when
``--engine ray`` is used.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.cluster.core.topology import Topology
from phalanx.cluster.live.engines.base import (
    KILLED,
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
from phalanx.cluster.live.engines.ray_cluster import (
    DEVICE,
    NODE_LABEL,
    NODES_EVERY_S,
    START_TIMEOUT_S,
    HealthCheck,
    import_ray,
    ray_cluster,
    type_mismatch,
    verdict_s,
)
from phalanx.cluster.live.engines.ray_fence import Fence, dead_rank_ended
from phalanx.errors import ConfigError


def node_alive_asker() -> Callable[[float], bool]:
    """``ask(timeout_s)``: does the GCS hold this worker's node alive? (Ray's
    ``check_alive`` of one node id: a small call to the GCS; raises when it does not answer
    within ``timeout_s``.) In a Ray worker only."""
    ray = import_ray()
    worker = ray._private.worker.global_worker   # Ray has no public call for this
    gcs, node = worker.gcs_client, worker.current_node_id

    def ask(timeout_s: float) -> bool:
        return bool(gcs.check_alive([node], timeout=timeout_s)[0])

    return ask


class RankActor:
    """One rank (made a Ray actor by :class:`RayExecutor`), fenced: killed when its node is
    cut off from the cluster for ``fence_s`` (:mod:`ray_fence`)."""

    def __init__(self, python: str, fence_s: float) -> None:
        self.python = python
        self.proc: RankProcess | None = None
        self.fence = Fence(fence_s, node_alive_asker(), self._cut)

    def _cut(self, why: str) -> None:
        """The lease ran out: the rank of the moment dies (on the node's own log)."""
        proc = self.proc
        if proc is not None and proc.popen.poll() is None:
            proc.kill()
            print(f"phalanx: ray: {why}: rank pid {proc.pid} killed (fenced)", file=sys.stderr,
                  flush=True)

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

    def stop(self, grace_s: float, pid: int) -> None:
        """Stop rank ``pid`` (a late stop for an earlier rank of this device is ignored:
        calls to a threaded actor may run out of order)."""
        if self.proc is not None and self.proc.pid == pid:
            self.proc.stop(grace_s)   # ``wait``'s polling sends SIGKILL after the grace

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()


def kill_rank_here(pid: int) -> None:
    """SIGKILL the process group of rank ``pid`` if it is a phalanx rank on this host."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return
    if b"phalanx.entry.scheduled" in cmd:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


class _RayGang:
    def __init__(self, actors: list[Any], pids: list[int], waits: list[Any],
                 nodes: list[str]) -> None:
        self.actors, self.pids, self.waits, self.nodes = actors, pids, waits, nodes
        self.codes: list[int | None] = [None] * len(actors)
        self.died: dict[int, float] = {}   # rank -> when its actor was found dead
        self.stopping = False              # its other ranks were told to stop


@dataclass
class _Device:
    """A device's actor, in a one-bundle placement group that holds the device's resource
    (so on the device's node), kept for every later rank on that device."""

    actor: Any
    group: Any
    node: str = ""
    ip: str = ""


class RayExecutor:
    """Gangs as Ray actors on the nodes the scheduler chose: one actor per device, created
    before the clock starts (again when a lost node's devices are first used once it is
    back) and kept: a start or restart then costs two calls, not new worker processes."""

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
        bad = type_mismatch(topology, [n.get("Resources", {}) for n in ray.nodes()
                                       if n.get("Alive")])
        if bad:
            raise ConfigError(f"--ray-address {address}: {bad}")
        self.python, self.topology = python, topology
        self.actor = ray.remote(RankActor)
        self.devices: dict[int, _Device] = {}
        self.gangs: dict[str, _RayGang] = {}
        self.failed: dict[str, tuple[tuple[int, int], ...]] = {}
        self._down: frozenset[str] = frozenset()
        self._down_at: dict[str, float] = {}      # when each lost server was first seen so
        self._nodes_at = -float("inf")
        self.verdict_s = verdict_s()
        self.health = HealthCheck.from_env(os.environ)
        self._warm_up(address)

    def _warm_up(self, address: str) -> None:
        """Every device's actor, created now (all at once), before the scheduler's clock
        starts: created on a job's first start instead, a Ray worker's start-up (seconds,
        tens of them on a loaded host) would stall the loop while the jobs it already
        started run unwatched, and no round could preempt them."""
        n = self.topology.num_devices
        t = time.perf_counter()
        try:
            self._pinned(list(range(n)))
        except Exception as e:   # noqa: BLE001 - any Ray failure: one line, nothing behind
            self.close()
            raise ConfigError(f"ray cluster {address}: the devices' actors did not start "
                              f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
        print(f"phalanx: ray: {n} device actor{'s' if n != 1 else ''} ready in "
              f"{time.perf_counter() - t:.1f} s", flush=True)
        soonest, latest = self.health.silent_s()
        print(f"phalanx: ray: a node cut off is lost after {soonest:g}-{latest:g} s of "
              f"silence (Ray's health check); its ranks stop themselves after "
              f"{self.health.fence_s():g} s", flush=True)

    def down(self) -> frozenset[str]:
        """The servers none of whose live nodes declares all their devices (lost); the
        actors of their devices are dropped (they died with the node)."""
        now = time.monotonic()
        if now - self._nodes_at < NODES_EVERY_S:
            return self._down
        self._nodes_at = now
        try:
            nodes = self.ray.nodes()
        except Exception:   # noqa: BLE001 - the GCS did not answer: ask again next time
            return self._down
        have = {k for n in nodes if n.get("Alive") for k in n.get("Resources", {})}
        t = self.topology
        down = frozenset(s.name for s in t.servers
                         if any(DEVICE.format(d) not in have for d in s.devices))
        for d in [d for d in self.devices if t.servers[t.device_server[d]].name in down]:
            self._drop(d)
        self._down_at.update({s: now for s in down - self._down})
        self._down = down
        return down

    def _pinned(self, devices: list[int]) -> list[_Device]:
        """The actors of ``devices``, created (all at once) where missing."""
        from ray.util.placement_group import placement_group  # noqa: PLC0415
        from ray.util.scheduling_strategies import (  # noqa: PLC0415
            PlacementGroupSchedulingStrategy,
        )

        ray = self.ray
        new = [d for d in dict.fromkeys(devices) if d not in self.devices]
        for d in new:
            group = placement_group([{DEVICE.format(d): 1.0}])
            actor = self.actor.options(
                num_cpus=0, num_gpus=0, max_concurrency=4,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=0)).remote(self.python,
                                                                   self.health.fence_s())
            self.devices[d] = _Device(actor, group)
        try:
            where = ray.get([self.devices[d].actor.node.remote() for d in new],
                            timeout=START_TIMEOUT_S)
        except Exception:
            for d in new:
                self._drop(d)
            raise
        for d, (node, ip) in zip(new, where):
            self.devices[d].node, self.devices[d].ip = node, ip
        return [self.devices[d] for d in devices]

    def start(self, gang: Gang) -> None:
        ray = self.ray
        slots = gang.ranks if gang.per_rank else gang.ranks[:1]
        actors: list[Any] = []
        try:
            pinned = self._pinned([s.devices[0] for s in slots])
            actors = [p.actor for p in pinned]
            ip0 = pinned[0].ip
            master = (ip0, ray.get(actors[0].free_port.remote(ip0), timeout=START_TIMEOUT_S))
            lw = local_world(gang, master[0])
            cwd = os.getcwd()
            pids = ray.get([p.actor.start.remote(gang.argv, rank_env(gang, s, master, p.node,
                                                                     lw, s.local),
                                                 str(gang.log), cwd, gang.per_rank)
                            for p, s in zip(pinned, slots)], timeout=START_TIMEOUT_S)
        except Exception as e:   # noqa: BLE001 - any Ray failure: nothing may stay behind
            self._kill_ranks(actors)
            raise OSError(f"ray: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from None
        self.gangs[gang.job] = _RayGang(actors, pids, [a.wait.remote() for a in actors],
                                        [p.node for p in pinned])

    def poll(self, job: str) -> int | None:
        g = self.gangs[job]
        pending = [w for i, (w, c) in enumerate(zip(g.waits, g.codes))
                   if c is None and i not in g.died]
        ready, _ = self.ray.wait(pending, num_returns=len(pending), timeout=0) if pending \
            else ([], [])
        for w in ready:
            i = g.waits.index(w)
            try:
                g.codes[i] = self.ray.get(w)
            except Exception:   # noqa: BLE001 - the actor died (its node lost?)
                g.died[i] = time.monotonic()
                self._nodes_at = -float("inf")   # read the nodes again at once
        if g.died:
            # a dead actor's rank ends (as SIGKILL) once the cluster has called its node
            # dead, or after the cluster's own time to do so: the gang's exit (and so the
            # live loop's verdict, lost server or failure) waits for it, as a Slurm gang
            # waits for a lost node's batch job. Its peers fail first (they lost a rank).
            # (a lost node's rank counts as ended once its lease has surely run out too:
            # ``fenced_after_s``; before that it may still run, cut off)
            down, now = self.down(), time.monotonic()
            for i, t in list(g.died.items()):
                since = self._down_at[g.nodes[i]] if g.nodes[i] in down else None
                if dead_rank_ended(None if since is None else now - since, now - t,
                                   self.verdict_s, self.health.fence_s()):
                    g.codes[i] = KILLED
                    del g.died[i]
        note_failure(self.failed, job, g.codes)
        if (failed_rank(g.codes) or g.died) and not g.stopping:
            g.stopping = True   # once: the actors' own polling sends SIGKILL after 2 s
            for i, (a, pid, c) in enumerate(zip(g.actors, g.pids, g.codes)):
                if c is None and i not in g.died:
                    a.stop.remote(2.0, pid)
        rc = gang_exit(g.codes)
        if rc is not None:
            del self.gangs[job]
        return rc

    def stop(self, job: str, grace_s: float) -> None:
        g = self.gangs.get(job)
        if g is not None:
            for a, pid in zip(g.actors, g.pids):
                a.stop.remote(grace_s, pid)

    def _kill_ranks(self, actors: list[Any]) -> None:
        """Our processes first: Ray can leave an actor's children behind."""
        with contextlib.suppress(Exception):
            self.ray.get([a.kill.remote() for a in actors], timeout=30)

    def _drop(self, device: int) -> None:
        from ray.util.placement_group import remove_placement_group  # noqa: PLC0415

        dev = self.devices.pop(device)
        with contextlib.suppress(Exception):
            self.ray.kill(dev.actor)
        with contextlib.suppress(Exception):
            remove_placement_group(dev.group)

    def stop_leftovers(self, logs: Sequence[Path], grace_s: float) -> dict[str, int]:
        return {}    # the actors, and their ranks, died with the scheduler that owned them

    def close(self) -> None:
        # a Ctrl-C from a terminal also reaches a local cluster's raylets: if they died
        # first, their actors cannot stop our ranks; on this host, stop them ourselves
        for g in self.gangs.values():
            for pid in g.pids:
                kill_rank_here(pid)
        self._kill_ranks([d.actor for d in self.devices.values()])
        self.gangs.clear()
        for d in list(self.devices):
            self._drop(d)


def ray_engine(topology: Topology, options: EngineOptions,
               stack: contextlib.ExitStack) -> Executor:
    """``--ray-address``'s cluster, or a local Ray cluster built from ``topology``."""
    address = stack.enter_context(ray_cluster(topology, options.ray_address))
    return RayExecutor(topology, address, options.python)
