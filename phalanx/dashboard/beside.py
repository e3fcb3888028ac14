"""``phalanx schedule --dashboard PORT``: the page served on a thread of the scheduler, over
its ``--out`` folder. Before it starts, two small files go into that folder for the page,
which reads files only: ``topology.yaml`` (the cluster, for the map) and
``dashboard-jobs.json`` (each job's arrival, for queue delays and JCTs while it runs)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from phalanx.cluster.core.cluster_file import save_topology
from phalanx.cluster.core.topology import Topology
from phalanx.dashboard.cluster_map import TOPOLOGY_FILE
from phalanx.dashboard.schedules import ARRIVALS_FILE
from phalanx.dashboard.serve import Served, check_host, check_port, serve_in_thread


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def serve_beside(out: Path, topology: Topology, arrivals: Iterable[tuple[str, float]],
                 port: int, host: str = "127.0.0.1") -> Served:
    """Write the page's two files into ``out`` and serve it; ``stop()`` it at the end."""
    check_port(port, "--dashboard")
    host = check_host(host)
    tmp = out / f".{TOPOLOGY_FILE}.{os.getpid()}.tmp"
    save_topology(topology, tmp)
    os.replace(tmp, out / TOPOLOGY_FILE)
    _atomic(out / ARRIVALS_FILE, json.dumps(dict(arrivals)))
    served = serve_in_thread(out, host, port, "--dashboard")
    print(f"dashboard: {served.url} (read-only; it stops with the schedule; "
          f"phalanx dashboard {out} shows it after)", flush=True)
    return served
