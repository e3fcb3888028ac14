"""What a Slurm cluster must declare for ``phalanx schedule --engine slurm`` to pin ranks:
the node and GRES lines of a topology, and the whole configuration of a local cluster.

* **One node per server**, named as the topology names it (``--nodelist`` pins a rank's node).
* **One typed GRES per device**: ``gpu`` of type ``phx<global device id>`` (``GRES_TYPE``),
  each node's devices listed in their local order, so ``--gres=gpu:phx5:1`` can only be
  device 5, and the index Slurm reports for it (``SLURM_JOB_GPUS``) is its number on its
  node. A type must not look like a count (``gpu:5`` asks for five GPUs), hence the prefix.
  On a cluster of several device types the GRES type starts with the GPU type,
  ``<type>_phx<id>`` (``gpu:a100_phx5:1``), as Slurm names GPU types (``gpu:a100:1``): a
  node must declare the type the topology gives its devices.
* A local cluster's devices are character devices that we make (major 195, NVIDIA's, minor
  = the global id) in its own folder: Slurm's GRES needs a device file per GPU, nothing
  opens them.

:func:`local_conf` writes the rest of a local cluster (one ``slurmctld`` and one ``slurmd``
per server, each on its own port of 127.0.0.1, or of its test host's own address; munge
with our own key and socket).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from phalanx.cluster.core.topology import Server, Topology
from phalanx.errors import ConfigError

GRES_TYPE = "phx{}"              # the GRES type of global device id N
TYPED_GRES_TYPE = "{}_phx{}"     # ... on a cluster of several device types: <type>_phx<N>
GPU_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*")   # what a GRES type may carry of it
PARTITION = "phalanx"            # the local cluster's partition
DEVICE_MAJOR = 195               # NVIDIA's character-device major number
MAX_LOCAL_SERVERS = 16           # one slurmd each, all on this machine


def gres_type(topology: Topology, device: int) -> str:
    """Device ``device``'s GRES type: ``phx<id>``, or ``<GPU type>_phx<id>`` where the
    topology has several device types."""
    if not topology.typed:
        return GRES_TYPE.format(device)
    kind = topology.device_type_of(device)
    if not GPU_TYPE.fullmatch(kind):
        raise ConfigError(f"--cluster {topology.name}: device type {kind!r} cannot name a "
                          "Slurm GRES type (letters, digits, '.' and '-' only)")
    return TYPED_GRES_TYPE.format(kind, device)


def gres_pattern(topology: Topology) -> str:
    """What every device's GRES looks like, for messages."""
    return "gpu:<type>_phx<device id>" if topology.typed else "gpu:phx<device id>"


def device_file(folder: Path, device: int) -> Path:
    return folder / f"nvidia{device}"


def gres_request(topology: Topology, devices: tuple[int, ...]) -> str:
    """``--gres`` that asks for exactly ``devices`` (all on one node)."""
    return ",".join(f"gpu:{gres_type(topology, d)}:1" for d in devices)


def node_line(topology: Topology, server: Server, port: int = 0, addr: str = "") -> str:
    """A ``slurm.conf`` NodeName line: the server's cores and its typed GRES."""
    gres = gres_request(topology, server.devices)
    # on a test host slurmd runs under its address as host name (AS_ADDR), and so binds it
    name = "localhost" if addr.startswith("127.") else addr
    where = f" NodeHostname={name} NodeAddr={addr} Port={port}" if port else ""
    # at least one CPU per device: every rank asks for one core
    cpus = max(server.cpu_cores, server.num_devices)
    return f"NodeName={server.name}{where} CPUs={cpus} Gres={gres} State=UNKNOWN"


def gres_lines(topology: Topology, dev_dir: Path) -> list[str]:
    """``gres.conf``: one typed GPU per device file, in local order on each node."""
    return [f"NodeName={s.name} Name=gpu Type={gres_type(topology, d)} "
            f"File={device_file(dev_dir, d)}" for s in topology.servers for d in s.devices]


@dataclass(frozen=True)
class LocalPorts:
    """The ports of a local Slurm cluster's daemons (slurmctld and one slurmd per node) and
    their addresses: 127.0.0.1 for all (one host), or each node its test host's address
    and slurmctld the first node's (``addrs``, one per server in server order)."""

    controller: int
    nodes: tuple[int, ...]       # one per server, in server order
    addrs: tuple[str, ...] = ()  # one per server; () = every daemon on 127.0.0.1

    def addr(self, node: int) -> str:
        return self.addrs[node] if self.addrs else "127.0.0.1"


def ctld_host(ports: LocalPorts) -> str:
    """``SlurmctldHost``: slurmctld runs only where its host name is this entry's (or
    ``localhost``). On test hosts it runs under its address as host name (:data:`AS_ADDR`)."""
    return "localhost(127.0.0.1)" if not ports.addrs else ports.addr(0)


# The prefix that runs a daemon under the host name ``$0`` (a UTS namespace of its own).
# With NoInAddrAny / NoCtldInAddrAny slurmd and slurmctld bind what their host name
# resolves to; test hosts share this machine's name, which resolves to loopback, so on a
# test host each daemon is named by its host's address (numeric: it resolves to itself).
AS_ADDR = ("unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"')


def local_conf(topology: Topology, folder: Path, ports: LocalPorts) -> str:
    """``slurm.conf`` of a local cluster in ``folder``: every daemon on its address
    (``ports``), every file it writes (state, spool, logs, pid files) under ``folder``."""
    f = folder
    lines = [
        "ClusterName=phalanx",
        f"SlurmctldHost={ctld_host(ports)}",
        f"SlurmctldPort={ports.controller}",
        "SlurmUser=root",
        # munge with our own key, through our own socket
        "AuthType=auth/munge", f"AuthInfo=socket={f}/munge/munge.socket", "CredType=cred/munge",
        # bind each daemon's own address, never all interfaces
        "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny",
        f"StateSaveLocation={f}/state",
        f"SlurmdSpoolDir={f}/spool/%n",           # %n: each slurmd its own (multiple slurmd)
        f"SlurmctldPidFile={f}/slurmctld.pid", f"SlurmdPidFile={f}/slurmd-%n.pid",
        f"SlurmctldLogFile={f}/log/slurmctld.log", f"SlurmdLogFile={f}/log/slurmd-%n.log",
        # no cgroups: ranks stay in their process group, which a signal reaches
        "ProctrackType=proctrack/pgid", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none", "SwitchType=switch/none", "MpiDefault=none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        # the nodes' CPUs are the topology's, not this machine's
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        # start a submitted job at once (the default waits up to 3 s to batch submissions)
        "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0",
        "KillWait=5", "MinJobAge=600", "MailProg=/bin/true",
        # a slurmd silent this long is down (its jobs NODE_FAIL): a lost node is noticed in
        # seconds, not Slurm's default 5 minutes. The controller's ping of a dead slurmd
        # waits MessageTimeout (default 10 s) before the node is 'not responding': measured
        # from a slurmd's SIGTERM, not responding / down after 14 s / 27 s with the
        # defaults and SlurmdTimeout=6, after 6 s / 12 s with these (a local daemon answers
        # in milliseconds; 3 s leaves room for a loaded machine)
        "SlurmdTimeout=5", "MessageTimeout=3",
    ]
    lines += [node_line(topology, s, port, ports.addr(i))
              for i, (s, port) in enumerate(zip(topology.servers, ports.nodes, strict=True))]
    nodes = ",".join(s.name for s in topology.servers)
    lines.append(f"PartitionName={PARTITION} Nodes={nodes} Default=YES MaxTime=INFINITE "
                 "State=UP OverSubscribe=NO")
    return "\n".join(lines) + "\n"
