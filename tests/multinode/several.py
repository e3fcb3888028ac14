"""Run several phalanx configurations one after another in ONE torchrun group.

    torchrun ... tests/multinode/several.py RUNS.json [IFACE]

``RUNS.json`` is a list of flag lists (``phalanx.runtime.torchrun_entry``'s flags, each with
its own ``--out``). Starting torchrun and its workers costs tens of seconds on a loaded
2-core machine; the strategies themselves take a second or two each, so the multi-node
tests start one group and run every strategy in it, exactly as the entry point would
(same interface choice, same per-strategy ``_main``), with a barrier between runs.
With ``IFACE``, each rank also writes the kernel's tx/rx byte counts of that interface
during each run to ``OUT/netstats-rank<R>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist

from phalanx.cli import _Parser, add_run_config_flags, config_from_args
from phalanx.errors import PhalanxError
from phalanx.runtime import netif, torchrun_entry


def _counter(iface: str, what: str) -> int:
    return int(Path(f"/sys/class/net/{iface}/statistics/{what}").read_text())


def _all(rank: int, world: int, cfgs: list, iface: str) -> None:
    for cfg in cfgs:
        dist.barrier()  # sync point: every rank starts the run (and its byte count) together
        before = (_counter(iface, "tx_bytes"), _counter(iface, "rx_bytes")) if iface else None
        torchrun_entry._main(rank, world, cfg, time.perf_counter(), 0)  # ends in a barrier
        if before is not None:
            # the kernel's count for this host (one process per host in the byte tests)
            after = _counter(iface, "tx_bytes"), _counter(iface, "rx_bytes")
            Path(cfg.out, f"netstats-rank{rank}.json").write_text(json.dumps(
                {"tx_bytes": after[0] - before[0], "rx_bytes": after[1] - before[1]}))


def main() -> int:
    runs = json.loads(open(sys.argv[1]).read())
    iface = sys.argv[2] if len(sys.argv) > 2 else ""  # read its kernel byte counters
    parser = _Parser(prog="several")
    add_run_config_flags(parser)
    world = int(os.environ["WORLD_SIZE"])
    try:
        cfgs = [config_from_args(parser.parse_args(flags)) for flags in runs]
        binding = netif.choose(os.environ["MASTER_ADDR"],
                               multi_host=world > int(os.environ["LOCAL_WORLD_SIZE"]),
                               env_iface=os.environ.get("GLOO_SOCKET_IFNAME", ""))
        print(f"rank {os.environ['RANK']} binds {binding}", flush=True)
        torchrun_entry._run_attempt(_all, (cfgs, iface), 0, 120.0, binding)
    except PhalanxError as e:
        sys.stderr.write(f"phalanx: error: {e}\n")
        os._exit(2)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
