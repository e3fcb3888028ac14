"""Run several phalanx configurations one after another in ONE torchrun group (test hosts).

    torchrun ... -m phalanx.experiments.hostgroup PLAN.json

``PLAN.json`` is a :class:`Plan`: a list of runs, each ``phalanx.entry.torchrun``'s
flags (with its own ``--out``) and optionally a link rate and an interface whose kernel byte
counters to read. Starting torchrun and its workers costs tens of seconds on a loaded 2-core
machine while 20 steps of a small MLP take a second or two, so the multi-node tests and the
bandwidth experiment start one group and run every configuration in it, exactly as the entry
point would (same interface choice, same ``_main``), with barriers between runs.

Per run, before it starts (behind a barrier): local rank 0 of each host re-shapes its
host's link in both directions (``tc``: its own ``eth0`` and its port on the bridge) when
the run names a rate. With ``netstats``, each rank writes the kernel's tx/rx byte and packet
counts of that interface during the run, its MTU, the TCP segments its host sent again
(retransmissions), the retransmission timeouts it took (TcpExt TCPTimeouts) and the run's
seconds to ``OUT/netstats-rank<R>.json`` (one process per host: the host's count is that
rank's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch.distributed as dist

from phalanx.entry import torchrun as torchrun_entry
from phalanx.entry.flags import _Parser, add_run_config_flags, config_from_args
from phalanx.errors import PhalanxError
from phalanx.runtime import netif
from phalanx.runtime.hosts import start_torchrun, tbf_args


@dataclass
class PlannedRun:
    flags: list[str]
    rate_mbit: float | None = None  # shape every link to this before the run
    netstats: str = ""  # interface whose kernel byte counters are read around the run


@dataclass
class Plan:
    runs: list[PlannedRun]
    bridge_ns: str = ""  # the test network's bridge namespace (for shaping)
    ports: dict[str, str] = field(default_factory=dict)  # host address -> its bridge port

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @staticmethod
    def read(path: Path) -> Plan:
        raw = json.loads(path.read_text())
        return Plan([PlannedRun(**r) for r in raw["runs"]], raw["bridge_ns"], raw["ports"])


def _counter(iface: str, what: str) -> int:
    return _counter_file(iface, f"statistics/{what}")


def _counter_file(iface: str, what: str) -> int:
    return int(Path(f"/sys/class/net/{iface}/{what}").read_text())


def _retrans() -> int:
    """TCP segments this host's network namespace has sent again (``/proc/net/snmp``'s
    RetransSegs; each is a full segment in practice: 1,448 bytes of payload on a 1,500-byte
    MTU, measured against ``ss``'s per-connection ``bytes_retrans``)."""
    lines = [ln.split() for ln in Path("/proc/net/snmp").read_text().splitlines()
             if ln.startswith("Tcp:")]
    return int(lines[1][lines[0].index("RetransSegs")])


def _tcp_timeouts() -> int:
    """Retransmission timeouts this namespace's TCP took (``/proc/net/netstat``'s TcpExt
    TCPTimeouts): a lost segment no duplicate ACK recovered, its sender idle 200 ms or
    more."""
    lines = [ln.split() for ln in Path("/proc/net/netstat").read_text().splitlines()
             if ln.startswith("TcpExt:")]
    return int(lines[1][lines[0].index("TCPTimeouts")])


COUNTERS = ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets")


def _counters(iface: str) -> dict[str, float]:
    got: dict[str, float] = {k: _counter(iface, k) for k in COUNTERS}
    got["retrans_segs"] = _retrans()
    got["tcp_timeouts"] = _tcp_timeouts()
    got["seconds"] = time.perf_counter()
    return got


def _shape(plan: Plan, addr: str, iface: str, rate_mbit: float) -> None:
    tbf = ["root", "tbf", *tbf_args(rate_mbit)]
    subprocess.run(["tc", "qdisc", "replace", "dev", iface, *tbf], check=True,
                   capture_output=True)
    subprocess.run(["ip", "netns", "exec", plan.bridge_ns, "tc", "qdisc", "replace", "dev",
                    plan.ports[addr], *tbf], check=True, capture_output=True)


def _all(rank: int, world: int, plan: Plan, cfgs: list, binding: netif.Binding,
         attempt: int) -> None:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    for run, cfg in zip(plan.runs, cfgs):
        if run.rate_mbit is not None and local_rank == 0:
            _shape(plan, binding.addr, binding.iface, run.rate_mbit)
        dist.barrier()  # sync point: every link shaped; every rank starts the run together
        iface = run.netstats
        before = _counters(iface) if iface else None
        torchrun_entry._main(rank, world, cfg, time.perf_counter(), 0)  # ends in a barrier
        if before is not None:
            after = _counters(iface)
            got = {k: after[k] - before[k] for k in after}
            got["mtu"] = _counter_file(iface, "mtu")
            Path(cfg.out, f"netstats-rank{rank}.json").write_text(json.dumps(got))


def main() -> None:
    plan = Plan.read(Path(sys.argv[1]))
    parser = _Parser(prog="phalanx.experiments.hostgroup")
    add_run_config_flags(parser)
    world = int(os.environ["WORLD_SIZE"])
    try:
        cfgs = [config_from_args(parser.parse_args(run.flags)) for run in plan.runs]
        binding = netif.choose(os.environ["MASTER_ADDR"],
                               multi_host=world > int(os.environ["LOCAL_WORLD_SIZE"]),
                               env_iface=os.environ.get("GLOO_SOCKET_IFNAME", ""))
        torchrun_entry._run_attempt(_all, (plan, cfgs, binding), 0, 300.0, binding)
    except PhalanxError as e:
        sys.stderr.write(f"phalanx: error: {e}\n")
        os._exit(2)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()


def run_plan(net, nproc: int, plan: Plan, out: Path, *, timeout_s: float = 600,
             poll=None) -> None:
    """Start ``plan`` under torchrun on every host of ``net`` (``nproc`` processes each) and
    wait; ``poll()`` is called every 0.2 s meanwhile. Raises with both hosts' log tails when
    the group fails or runs past ``timeout_s``."""

    out.mkdir(parents=True, exist_ok=True)
    plan.write(out / "plan.json")
    procs = start_torchrun(net, nproc, ["-m", "phalanx.experiments.hostgroup",
                                        str(out / "plan.json")], out / "logs")
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < timeout_s and any(p.poll() is None for p in procs):
            if poll is not None:
                poll()
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = [p.returncode for p in procs]
    if codes != [0] * len(procs):
        tails = "\n".join(f"--- host {i}\n" + (out / "logs" / f"host{i}.log").read_text()[-3000:]
                          for i in range(len(procs)))
        raise PhalanxError(f"torchrun on the test hosts exited with {codes}\n{tails}")
