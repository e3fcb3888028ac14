"""The Ray cluster the Ray engine (``ray.py``) runs on: each node's resources and labels from
the topology (one custom resource per device, one per device type), the check that a
cluster's nodes declare what the topology says, the address probe, and a local cluster
started for a run (``ray_cluster``) and stopped after it. ``ray`` is imported only when
``--engine ray`` is used (:func:`import_ray`)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from phalanx.cluster.core.topology import Topology
from phalanx.errors import ConfigError
from phalanx.runtime.signals import socket_temp_root

DEVICE = "phx_dev_{}"                # custom resource of one device (global id)
TYPE = "phx_type_{}"                 # a node's devices of one type (their count)
LABELS = ("phalanx.zone", "phalanx.rack", "phalanx.server")
NODE_LABEL = "phalanx.server"
OBJECT_STORE = 80 * 2**20            # Ray's minimum is 75 MiB; ranks pass no objects
START_TIMEOUT_S = 120.0
NODES_EVERY_S = 0.5                  # how often the cluster's live nodes are read
LOCAL_ENV = ("RAY_USAGE_STATS_ENABLED", "RAY_TMPDIR", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")


NO_RAY = "--engine ray needs Ray: install the 'ray' extra (pip install -e '.[ray]')"


def import_ray() -> ModuleType:
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ConfigError(NO_RAY) from None


def have_ray() -> bool:
    """Is Ray installed (without importing it: its settings are read at import)."""
    if "ray" in sys.modules:
        return sys.modules["ray"] is not None
    return importlib.util.find_spec("ray") is not None


def node_resources(topology: Topology, server: int) -> dict[str, float]:
    """A server's node: one resource per device, and its device type's count."""
    s = topology.servers[server]
    out = {DEVICE.format(d): 1.0 for d in s.devices}
    out[TYPE.format(s.device_type)] = float(s.num_devices)
    return out


def type_mismatch(topology: Topology, nodes: list[dict[str, float]]) -> str:
    """Where the live nodes (their resources) contradict the topology's device types ('':
    nowhere): each server's devices must be on a node that declares its type
    (``phx_type_<type>``) and no other. A node that declares no type is accepted on a
    cluster of one type (clusters started before types were declared)."""
    prefix = TYPE.format("")
    for s in topology.servers:
        names = [DEVICE.format(d) for d in s.devices]
        for res in nodes:
            if not all(n in res for n in names):
                continue
            types = sorted(k[len(prefix):] for k in res if k.startswith(prefix))
            if types == [s.device_type] or (not types and not topology.typed):
                break
            have = (f"declares type(s) {', '.join(types)}" if types
                    else "declares no type")
            return (f"server {s.name} ({', '.join(names[:2])}{', ...' if len(names) > 2 else ''}) "
                    f"is on a node that {have}, but --cluster {topology.name} says "
                    f"{s.device_type} (ray start --resources '{{\"{TYPE.format(s.device_type)}\": "
                    f"{s.num_devices}, ...}}')")
    return ""


def node_labels(topology: Topology, server: int) -> dict[str, str]:
    s = topology.servers[server]
    return dict(zip(LABELS, (str(s.zone), str(s.rack), s.name)))


# Ray's longest socket path below its temp root: "/ray/session_<date>_<time>_<us>_<pid>"
# (<= 48 bytes) + "/sockets/plasma_store" (21); an AF_UNIX path holds at most 107 bytes
RAY_SOCKET_TAIL = 69
PROBE_S = 5.0  # seconds to wait for --ray-address to answer


def ray_temp_root() -> str:
    """Where the local cluster's temp folder goes: the temp folder (``TMPDIR``) when Ray's
    socket paths fit under it, else /tmp (users' TMPDIRs are often long); a one-line error
    when neither can hold them."""
    return socket_temp_root(len("/phalanx-ray-") + 8 + RAY_SOCKET_TAIL,  # + mkdtemp's name
                            "Ray's socket paths")


def check_address(address: str, timeout_s: float = PROBE_S) -> None:
    """``--ray-address HOST:PORT`` must answer before Ray is asked to join it (``ray.init``
    retries an address where nothing listens for minutes)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--ray-address {address!r}: expected HOST:PORT of a Ray head "
                          "(ray start --head --port PORT)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as e:
        why = (f"no answer in {timeout_s:g} s" if isinstance(e, TimeoutError)
               else (e.strerror or str(e)).lower())
        raise ConfigError(f"--ray-address {address}: nothing answers there ({why}); start "
                          "the head with ray start --head") from None


@contextlib.contextmanager
def ray_cluster(topology: Topology, address: str = "") -> Iterator[str]:
    """The address of the cluster to schedule on: ``address`` as given, or a local cluster
    with one Ray node per server of ``topology``, all on 127.0.0.1, no dashboard, its
    temp folder removed afterwards."""
    if address:
        check_address(address)
        if address.split(":")[0] in ("127.0.0.1", "localhost"):
            # a one-machine cluster: keep Ray from resolving loopback to a network address
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        yield address
        return
    if not have_ray():
        raise ConfigError(NO_RAY)
    tmp = tempfile.mkdtemp(prefix="phalanx-ray-", dir=ray_temp_root())
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
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        # Ray's workers leave a moment after their raylet and may make the folder again
        # on the way out: remove it once no process of this cluster is left
        wait_gone(f"RAY_TMPDIR={tmp}".encode())
        shutil.rmtree(tmp, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def wait_gone(marker: bytes, timeout_s: float = 15.0) -> None:
    """Wait until no other process has ``marker`` in its environment (Linux /proc)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = False
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                if marker in (proc / "environ").read_bytes():
                    alive = True
                    break
            except OSError:
                continue
        if not alive:
            return
        time.sleep(0.1)


@dataclass(frozen=True, kw_only=True)
class HealthCheck:
    """How Ray's GCS calls a node dead (``RAY_health_check_period_ms``,
    ``_timeout_ms``, ``_failure_threshold``; Ray's defaults 3 s, 10 s, 5): it asks each node
    every period and calls it dead after ``threshold`` failed checks in a row. A crashed
    node refuses at once; a silent one (cut off by a partition) fails each check only when
    its timeout runs out, so silence takes longest."""

    period_s: float = 3.0
    timeout_s: float = 10.0
    threshold: int = 5

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> HealthCheck:
        """Ray's settings as a node started with ``env`` reads them (a bad value: Ray's
        default)."""
        def read(name: str, default: float) -> float:
            try:
                return max(0.0, float(env.get(f"RAY_health_check_{name}", default)))
            except ValueError:
                return default
        return cls(period_s=read("period_ms", 3000) / 1000,
                   timeout_s=read("timeout_ms", 10000) / 1000,
                   threshold=max(1, int(read("failure_threshold", 5))))

    def silent_s(self) -> tuple[float, float]:
        """The soonest and the latest the GCS calls a node dead after it fell silent: each
        of ``threshold`` checks runs out its timeout, a period apart (the last one
        scheduled up to a period late)."""
        soonest = self.threshold * self.timeout_s + (self.threshold - 1) * self.period_s
        return soonest, soonest + self.period_s

    def fence_s(self) -> float:
        """How long a node that cannot hear the GCS lets its ranks run (``ray_fence``):
        half the soonest verdict, so that they are gone before the scheduler hears the
        node is dead and starts their job elsewhere."""
        return self.silent_s()[0] / 2


def verdict_s(env: Mapping[str, str] | None = None) -> float:
    """How long the cluster may take to call a dead or cut-off node dead: the latest
    verdict on a silent node (:class:`HealthCheck`, read from this process's environment as
    a local cluster's nodes get it), plus our polling of the nodes and 2 s."""
    check = HealthCheck.from_env(os.environ if env is None else env)
    return check.silent_s()[1] + 2 * NODES_EVERY_S + 2.0
