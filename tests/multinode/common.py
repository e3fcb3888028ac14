"""Helpers of the multi-node tests: run a list of configurations in one torchrun group on
test hosts, and watch every listening socket while it runs."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from phalanx.experiments.hostgroup import Plan, PlannedRun
from phalanx.runtime.hosts import Listener, TestNetwork, start_torchrun

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
    out.mkdir(parents=True, exist_ok=True)
    plan.write(out / "plan.json")
    target = ["-m", "phalanx.experiments.hostgroup", str(out / "plan.json")]
    procs = start_torchrun(net, nproc, target, out / "logs")
    sockets = SocketWatch(net) if watch else None
    if sockets is not None:
        sockets.__enter__()
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < timeout_s and any(p.poll() is None for p in procs):
            time.sleep(0.2)
    finally:
        if sockets is not None:
            sockets.__exit__()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = [p.returncode for p in procs]
    if codes != [0] * len(procs):
        logs = "\n".join(f"--- host {i}\n" + (out / "logs" / f"host{i}.log").read_text()[-3000:]
                         for i in range(len(procs)))
        raise AssertionError(f"torchrun exit codes {codes}\n{logs}")
    return sockets
