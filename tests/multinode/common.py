"""Helpers of the multi-node tests: run a list of configurations in one torchrun group on
test hosts, and watch every listening socket while it runs."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from phalanx.experiments.hostgroup import Plan, PlannedRun, run_plan
from phalanx.runtime.hosts import Listener, TestNetwork

BASE = {"model": "mlp", "data": "synthetic", "max_steps": 20, "batch_size": 16, "lr": 0.05,
        "rule": "momentum", "train_limit": 1600, "test_limit": 200, "progress": False,
        "tensorboard": False}


def flags(values: dict) -> list[str]:
    return [a for k, v in values.items()
            for a in ((f"--{k.replace('_', '-')}",) if v is True
                      else (f"--no-{k.replace('_', '-')}",) if v is False
                      else (f"--{k.replace('_', '-')}", str(v)))]


@dataclass
class SocketWatch:
    """Samples every host's listening sockets until stopped (the union of what was seen)."""

    net: TestNetwork
    seen: dict[int, set[Listener]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> SocketWatch:
        self.seen = {i: set() for i in range(len(self.net.hosts))}
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            for i, host in enumerate(self.net.hosts):
                self.seen[i].update(host.listening())
            time.sleep(0.3)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()


def run_group(net: TestNetwork, nproc: int, runs: dict[str, dict], out: Path, *,
              timeout_s: float = 300, watch: bool = False,
              netstats: str = "") -> SocketWatch | None:
    """Run ``runs`` (name -> flags) in one torchrun group of ``nproc`` processes per host;
    each run writes to ``out/name``. Fails with both hosts' logs if the group fails."""
    plan = Plan([PlannedRun(flags({**values, "out": str(out / name)}), netstats=netstats)
                 for name, values in runs.items()])
    sockets = SocketWatch(net) if watch else None
    if sockets is not None:
        sockets.__enter__()
    try:
        run_plan(net, nproc, plan, out, timeout_s=timeout_s)
    finally:
        if sockets is not None:
            sockets.__exit__()
    return sockets
