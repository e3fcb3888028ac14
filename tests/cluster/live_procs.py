"""What the live-engine tests look for on this host: processes by a piece of their command
line, the addresses their sockets listen on (/proc/net/tcp{,6}), and each rank's record
against the scheduler's placement."""

import os
from pathlib import Path

from phalanx.runtime import rank_record

# 127.0.0.1 as /proc/net/tcp writes it, as an IPv4-mapped IPv6 address, and ::1
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}


def pids_with(text: str) -> list[int]:
    """Processes whose command line mentions ``text`` (an out folder, an engine's temp)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            out.append(int(p.name))
    return out


def listeners(pids: list[int]) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} writes them) of LISTEN sockets of pids."""
    inodes = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:
                found.add(cols[1].split(":")[0])
    return found


def ranks_where_placed(out: Path, rows: dict[str, dict], topology, jobs: str
                       ) -> list[tuple[str, list[str], list[str]]]:
    """Check every start of each job in ``jobs`` against the ranks' own records: one record
    per rank per start, each on the node of the device the scheduler gave it and seeing
    only that device, numbered on its node. Returns the moves (job, nodes before, nodes
    after) between consecutive starts."""
    moved = []
    for n in jobs:
        starts = [p.split("@")[1] for p in rows[n]["placements"].split(";")]
        recs = rank_record.read(out / "ranks" / f"{n}.jsonl")
        assert len(starts) == int(rows[n]["preemptions"]) + 1
        assert sorted((x.start, x.rank) for x in recs) == sorted(
            (k, r) for k, devs in enumerate(starts) for r in range(len(devs.split(","))))
        for x in recs:
            device = sorted(int(d) for d in starts[x.start].split(","))[x.rank]
            server = topology.servers[topology.device_server[device]]
            assert (x.node, x.devices) == (server.name, str(device - server.first_device)), x
        nodes = [sorted(x.node for x in recs if x.start == k) for k in range(len(starts))]
        moved += [(n, a, b) for a, b in zip(nodes, nodes[1:]) if a != b]
    return moved
