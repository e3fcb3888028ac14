"""The executor interface the live loop drives, and what every engine shares (a rank's
process, its environment, a gang's exit).

The live loop (:mod:`phalanx.cluster.live.loop`) decides; an executor carries out: ``start`` a
gang on the placement the scheduler chose, ``stop`` it (SIGTERM to every rank, SIGKILL
after a grace period), ``poll`` it for its exit. Progress is read from the job's own event
log (:mod:`phalanx.cluster.live.observe`), which every backend writes to the run folder.

A gang is launched in one of two ways (:class:`Gang`):

* **ranks** (``per_rank``): one process per rank, ``python -m phalanx.entry.scheduled ...``
  with ``RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT`` and ``CUDA_VISIBLE_DEVICES`` set by
  us from the devices the scheduler assigned: what ``torchrun`` would start, without its
  agent (the scheduler is the agent). Strategies whose world is one rank per device (sync,
  average, ...). These ranks checkpoint and exit on SIGTERM (:mod:`phalanx.runtime.preempt`).
* **driver**: one ``python -m phalanx.cli train`` process that starts its own ranks on the
  node of the gang's first device (single-process strategies, the parameter server).

Engines (one catalog, :data:`phalanx.cluster.live.engines.ENGINES`): local
(:mod:`~phalanx.cluster.live.engines.local`: this machine, each device of the topology a
slot), Ray (:mod:`~phalanx.cluster.live.engines.ray`) and Slurm
(:mod:`~phalanx.cluster.live.engines.slurm`). Local and Ray reuse :class:`RankProcess` for
the process of one rank, so stopping, exit codes and process groups behave the same.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from phalanx.cluster.core.topology import Topology
from phalanx.runtime.stop_flag import PREEMPTED_EXIT

KILLED = -int(signal.SIGKILL)   # Popen's code for a process that SIGKILL ended


@dataclass(frozen=True)
class RankSlot:
    """Where one rank runs: the server (node) and the devices the scheduler gave it."""

    rank: int
    server: int
    node: str                       # the topology's server name (a Ray node's label)
    devices: tuple[int, ...]        # global device ids (the scheduler's bitmap indices)
    local: tuple[int, ...]          # the same devices numbered on their server


@dataclass(frozen=True)
class Gang:
    """One start of a job: the command every rank runs and where each rank goes."""

    job: str
    start: int                      # 0 for the first start, +1 per resume
    argv: tuple[str, ...]           # after ``python``
    ranks: tuple[RankSlot, ...]
    per_rank: bool                  # torchrun-style ranks (True) or one driver process
    preemptible: bool
    log: Path
    record: Path                    # where ranks append their rank records
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def claim(self) -> Path:
        """Where the first rank of this start to fail says so (:mod:`first_failure`)."""
        return self.record.with_name(f"{self.record.stem}.{self.start}.failed")


def rank_env(gang: Gang, slot: RankSlot, master: tuple[str, int], node: str,
             local_world: int, visible: tuple[int, ...]) -> dict[str, str]:
    """The environment of one rank's process (added to the launcher's). ``visible``: the
    rank's devices as its machine numbers them (set by us: Ray would renumber them)."""
    env = dict(gang.env)
    env.update(CUDA_VISIBLE_DEVICES=",".join(map(str, visible)),
               PHALANX_RANK_RECORD=str(gang.record), PHALANX_START=str(gang.start),
               PHALANX_FIRST_FAILURE=str(gang.claim),
               PHALANX_NODE=node, PHALANX_PREEMPTIBLE="1" if gang.preemptible else "0",
               OMP_NUM_THREADS="1")
    if gang.per_rank:
        world = len(gang.ranks)
        env.update(RANK=str(slot.rank), WORLD_SIZE=str(world), LOCAL_RANK="0",
                   LOCAL_WORLD_SIZE=str(local_world), GROUP_RANK=str(slot.server),
                   MASTER_ADDR=master[0], MASTER_PORT=str(master[1]),
                   # the scheduler is torchrun's agent here: rank 0 serves the group's store
                   TORCHELASTIC_USE_AGENT_STORE="False")
    return env


def free_port(addr: str = "127.0.0.1") -> int:
    """A port free on ``addr`` now (rank 0 binds it a moment later)."""
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def local_world(gang: Gang, master_addr: str) -> int:
    """Ranks that share a machine. One machine holds every node of a local cluster (a
    loopback master): the group is then single-host and gloo binds loopback."""
    if master_addr.startswith("127.") or master_addr == "localhost":
        return len(gang.ranks)
    return sum(1 for s in gang.ranks if s.server == gang.ranks[0].server)


class RankProcess:
    """One rank's process in its own process group (so a stop reaches what it started).

    ``hold_term``: the process starts with SIGTERM blocked (a signal mask survives fork and
    exec), so a stop that comes while the interpreter starts stays pending until
    ``phalanx.entry.scheduled`` has armed its stop flag and unblocks it: every stop of a
    rank is then answered with a checkpoint, however early it comes."""

    def __init__(self, python: str, argv: tuple[str, ...], env: Mapping[str, str],
                 log: Path, hold_term: bool = False) -> None:
        full = dict(os.environ)
        full.update(env)
        # this thread's mask is what the child inherits; other threads keep theirs
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM} if hold_term else set())
        try:
            with open(log, "ab") as out:
                self.popen = subprocess.Popen([python, *argv], stdout=out,
                                              stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, env=full,
                                              start_new_session=True)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        self.pid = self.popen.pid
        self.kill_at = float("inf")

    def poll(self) -> int | None:
        rc = self.popen.poll()
        if rc is None and time.monotonic() >= self.kill_at:
            self.signal(signal.SIGKILL)
        return rc

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, grace_s: float) -> None:
        """SIGTERM now; ``poll`` sends SIGKILL once ``grace_s`` has passed."""
        if self.popen.poll() is None:
            self.signal(signal.SIGTERM)
            self.kill_at = min(self.kill_at, time.monotonic() + grace_s)

    def kill(self) -> int:
        """SIGKILL the group and reap (blocking, short)."""
        self.signal(signal.SIGKILL)
        return self.popen.wait()


def gang_exit(codes: list[int | None]) -> int | None:
    """A gang's exit once every rank ended: 0 if all finished, :data:`PREEMPTED_EXIT` if
    they stopped on request, else the first failure's code."""
    if any(c is None for c in codes):
        return None
    bad = [c for c in codes if c not in (0, PREEMPTED_EXIT)]
    if bad:
        return bad[0]
    return PREEMPTED_EXIT if PREEMPTED_EXIT in codes else 0


def note_failure(failed: dict[str, tuple[tuple[int, int], ...]], job: str,
                 codes: list[int | None]) -> None:
    """Remember every rank of ``job`` seen ending badly at the first poll that saw any, with
    its code: the cause is among them (later ranks only fail because it did), and
    :func:`phalanx.runtime.first_failure.cause` picks it."""
    if job not in failed:
        bad = tuple((rank, c) for rank, c in enumerate(codes)
                    if c is not None and c not in (0, PREEMPTED_EXIT))
        if bad:
            failed[job] = bad


def failed_rank(codes: list[int | None]) -> bool:
    """A rank ended badly while others run: they would wait for it in a collective."""
    return any(c is not None and c not in (0, PREEMPTED_EXIT) for c in codes) and \
        any(c is None for c in codes)


class Executor(Protocol):
    """What an engine carries out for the live loop: start a gang on the devices the
    scheduler chose, stop it with a grace period, poll it, close."""

    name: str

    def start(self, gang: Gang) -> None:
        """Start every rank of ``gang`` (raises ``OSError`` if it cannot start)."""

    def poll(self, job: str) -> int | None:
        """None while any rank runs; then the gang's exit (:func:`gang_exit`)."""

    def stop(self, job: str, grace_s: float) -> None:
        """Ask every rank to stop (SIGTERM); SIGKILL after ``grace_s``. Returns at once."""

    def close(self) -> None:
        """Kill whatever still runs and free the engine's resources."""

    def down(self) -> frozenset[str]:
        """The servers (topology names) lost now: their node died or left the cluster.
        Cheap to call at every poll (an engine caches what it asks its cluster)."""

    # {job: ((rank, exit code), ...)}: the ranks first seen failing (:func:`note_failure`);
    # the live loop takes a job's entry when its gang has ended
    failed: dict[str, tuple[tuple[int, int], ...]]

    def stop_leftovers(self, logs: Sequence[Path], grace_s: float) -> dict[str, int]:
        """Stop the ranks of a killed scheduler's jobs (``logs``: their log files) that
        outlived it, before ``--resume`` starts them again; how many per job. Only an
        engine whose ranks outlive their scheduler (an existing Slurm cluster) finds any:
        the others' ranks die with it (:mod:`phalanx.cluster.live.restart`)."""


@dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """What an engine is built from: the ranks' Python, and where an existing cluster is
    (``--ray-address``, ``--slurm-partition``; empty: the engine builds a local one)."""

    python: str = sys.executable
    ray_address: str = ""
    slurm_partition: str = ""
    # local engine: pin each PCIe switch's slots to one core of this machine (--pin-cores)
    pin_cores: bool = False


# an engine: its executor for a topology; a cluster it starts is stopped when the stack
# closes
EngineFactory = Callable[[Topology, EngineOptions, contextlib.ExitStack], Executor]
