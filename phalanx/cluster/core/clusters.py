"""Ready-made clusters: named shapes, a ``uniform:`` shorthand, YAML files, and the importer
for the real heterogeneous Alibaba inventory (``alibaba-openb/openb_node_list_gpu_node.csv``).
"""

from __future__ import annotations

import csv
from pathlib import Path

from phalanx.cluster.core.cluster_file import load_topology
from phalanx.cluster.core.topology import DeviceType, Topology, TopologyBuilder, uniform
from phalanx.errors import ConfigError, DataError

# relative throughput of each Alibaba GPU model against a V100 (the reference device).
# T4/P100/V100 follow Gavel-style measured ratios; A10 and the anonymised G2/G3 have no
# public throughput in our data, so they are set from vendor FP32 ratios (an assumption).
ALIBABA_SPEED = {"V100M16": 1.0, "V100M32": 1.0, "P100": 0.62, "T4": 0.45, "A10": 0.9,
                 "G2": 0.7, "G3": 0.9}
ALIBABA_MEMORY = {"V100M16": 16, "V100M32": 32, "P100": 16, "T4": 16, "A10": 24, "G2": 24,
                  "G3": 32}


def default_data_dir() -> Path:
    """``../shared/data`` next to the repository root (where CI has it too)."""
    return (Path(__file__).resolve().parents[3] / ".." / "shared" / "data").resolve()


def philly_2048() -> Topology:
    """2,048 GPUs: 2 InfiniBand zones x 8 racks x 16 servers x 8 GPUs (2 PCIe switches)."""
    return uniform(zones=2, racks=8, servers=16, devices=8, switches=2, cpu_cores=32,
                   name="philly-2048")


def pollux_64() -> Topology:
    """Pollux's testbed shape: 16 servers x 4 GPUs (2 switches), one zone of 2 racks."""
    return uniform(zones=1, racks=2, servers=8, devices=4, switches=2, cpu_cores=24,
                   device_type="v100", name="pollux-64")


def three_nodes() -> Topology:
    """The live mode's test cluster: 3 one-device servers in 2 racks (a | b, c), so that a
    2-device gang spans nodes and racks. Its servers are slots of one machine under the
    local engine or a local Ray or Slurm cluster (``tests/cluster/test_*_live.py``,
    ``bench/live.py``)."""
    b = TopologyBuilder("three-nodes", [DeviceType("v100", 1.0)])
    b.begin_zone()
    for rack, servers in (("ra", "a"), ("rb", "bc")):
        b.begin_rack()
        for name in servers:
            b.add_server(name, "v100", (1,), cpu_cores=2, memory_gib=8)
        b.end_rack(rack)
    b.end_zone("z")
    return b.build()


# Sia's (SOSP'23) default cluster, ``sia-simulator/simulator_config.py``: GPU types named
# as its profiles are (``sia/profiles/<app>/placements-<type>.csv``). ``speed`` is only a
# nominal figure for jobs without a per-type profile; Sia's applications use their own.
SIA_TYPES = (DeviceType("aws", 0.5, 16.0),        # g4dn.12xlarge: 4x T4
             DeviceType("rtx", 1.0, 11.0),        # 8x RTX 2080Ti
             DeviceType("dgx-ext", 3.0, 40.0))    # DGX A100 (40 GB)
SIA_64 = (("aws", 6, 4, 48), ("rtx", 3, 8, 64), ("dgx-ext", 2, 8, 128))


def sia_64(scale: int = 1) -> Topology:
    """Sia's 64-GPU cluster: 6 aws nodes x 4 T4, 3 rtx x 8 2080Ti, 2 dgx-ext x 8 A100, one
    rack per type (``scale`` multiplies the nodes of each type: the MILP bench)."""
    b = TopologyBuilder("sia-64" if scale == 1 else f"sia-{64 * scale}", list(SIA_TYPES))
    b.begin_zone()
    for t, nodes, gpus, cores in SIA_64:
        b.begin_rack()
        for i in range(nodes * scale):
            b.add_server(f"{t}{i}", t, (gpus,), cpu_cores=cores, memory_gib=256)
        b.end_rack(t)
    b.end_zone("z")
    return b.build()


NAMED = {"philly-2048": philly_2048, "pollux-64": pollux_64, "three-nodes": three_nodes,
         "sia-64": sia_64}


def import_alibaba(path: str | Path, servers_per_rack: int = 16) -> Topology:
    """The Alibaba OpenB GPU inventory as a topology.

    The CSV has one row per node (sn, cpu_milli, memory_mib, gpu, model) and no network
    layout, so we group nodes into one InfiniBand zone per GPU model (a job never spans
    device types that way) and racks of ``servers_per_rack`` in file order. Devices of a
    node sit behind one PCIe switch per 4 GPUs (8-GPU nodes: two switches).
    """
    p = Path(path)
    try:
        f = p.open(newline="")
    except OSError as e:
        raise DataError(f"inventory {p}: cannot read ({e.strerror})") from None
    by_model: dict[str, list[tuple[str, int, float, int]]] = {}
    with f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header != ["sn", "cpu_milli", "memory_mib", "gpu", "model"]:
            raise DataError(f"inventory {p}: line 1: expected header "
                            f"sn,cpu_milli,memory_mib,gpu,model, got {header}")
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            try:
                sn, cpu, mem, gpu, model = row
                cores, memory, gpus = int(cpu) // 1000, int(mem) / 1024, int(gpu)
                if cores < 1 or gpus < 1 or memory <= 0 or not model:
                    raise ValueError
            except ValueError:
                raise DataError(f"inventory {p}: line {line}: bad row {row}") from None
            by_model.setdefault(model, []).append((sn, cores, memory, gpus))
    if not by_model:
        raise DataError(f"inventory {p}: no nodes")
    types = [DeviceType(m, ALIBABA_SPEED.get(m, 1.0), ALIBABA_MEMORY.get(m, 16))
             for m in sorted(by_model)]
    b = TopologyBuilder("alibaba-openb", types)
    for model in sorted(by_model):
        nodes = by_model[model]
        b.begin_zone()
        for start in range(0, len(nodes), servers_per_rack):
            b.begin_rack()
            for sn, cores, memory, gpus in nodes[start:start + servers_per_rack]:
                switches = [4] * (gpus // 4) + ([gpus % 4] if gpus % 4 else [])
                b.add_server(sn, model, switches, cores, memory)
            b.end_rack(f"{model}-rack{start // servers_per_rack}")
        b.end_zone(model)
    return b.build()


def resolve_cluster(spec: str, data_dir: Path) -> Topology:
    """``philly-2048`` | ``pollux-64`` | ``alibaba`` | ``uniform:Z,R,S,G[,switches]`` | a
    YAML file."""
    if spec in NAMED:
        return NAMED[spec]()
    if spec == "alibaba":
        return import_alibaba(data_dir / "alibaba-openb" / "openb_node_list_gpu_node.csv")
    if spec.startswith("uniform:"):
        try:
            parts = [int(x) for x in spec.split(":", 1)[1].split(",")]
        except ValueError:
            parts = []
        if len(parts) not in (4, 5):
            raise ConfigError(f"--cluster {spec}: expected uniform:ZONES,RACKS,SERVERS,GPUS"
                              f"[,SWITCHES] with integers")
        return uniform(*parts[:4], switches=parts[4] if len(parts) == 5 else 1)
    if Path(spec).suffix in (".yaml", ".yml"):
        return load_topology(spec)
    raise ConfigError(f"--cluster {spec}: not a known cluster ({', '.join(NAMED)}, alibaba, "
                      f"uniform:Z,R,S,G) nor a .yaml file")
