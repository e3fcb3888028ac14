"""Run several phalanx configurations one after another in ONE torchrun group.

    torchrun ... tests/multinode/several.py RUNS.json

``RUNS.json`` is a list of flag lists (``phalanx.runtime.torchrun_entry``'s flags, each with
its own ``--out``). Starting torchrun and its workers costs tens of seconds on a loaded
2-core machine; the strategies themselves take a second or two each, so the multi-node
tests start one group and run every strategy in it, exactly as the entry point would
(same interface choice, same per-strategy ``_main``), with a barrier between runs.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch.distributed as dist

from phalanx.cli import _Parser, add_run_config_flags, config_from_args
from phalanx.errors import PhalanxError
from phalanx.runtime import netif, torchrun_entry


def _all(rank: int, world: int, cfgs: list) -> None:
    for cfg in cfgs:
        torchrun_entry._main(rank, world, cfg, time.perf_counter(), 0)
        dist.barrier()  # sync point: the next run starts on every rank together


def main() -> int:
    runs = json.loads(open(sys.argv[1]).read())
    parser = _Parser(prog="several")
    add_run_config_flags(parser)
    world = int(os.environ["WORLD_SIZE"])
    try:
        cfgs = [config_from_args(parser.parse_args(flags)) for flags in runs]
        binding = netif.choose(os.environ["MASTER_ADDR"],
                               multi_host=world > int(os.environ["LOCAL_WORLD_SIZE"]),
                               env_iface=os.environ.get("GLOO_SOCKET_IFNAME", ""))
        print(f"rank {os.environ['RANK']} binds {binding}", flush=True)
        torchrun_entry._run_attempt(_all, (cfgs,), 0, 120.0, binding)
    except PhalanxError as e:
        sys.stderr.write(f"phalanx: error: {e}\n")
        os._exit(2)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
