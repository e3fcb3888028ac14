"""The local engine: every device of the topology is a slot of this machine, and a rank is
a child process of the scheduler, or under ``phalanx schedule`` of the copy of it that is
its fork server (:class:`ForkedRank`)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from phalanx.cluster.core.topology import Topology
from phalanx.cluster.live.engines.base import (
    EngineOptions,
    Executor,
    Gang,
    RankProcess,
    failed_rank,
    free_port,
    gang_exit,
    local_world,
    note_failure,
    rank_env,
)
from phalanx.runtime import supervise


class LocalExecutor:
    """Every slot is on this machine: ranks are children of the scheduler, and a slot's
    global device id is its CUDA device number (``uniform:1,1,2,2`` on a 4-GPU host)."""

    name = "local"

    def __init__(self, python: str = sys.executable, master_addr: str = "127.0.0.1",
                 pins: Mapping[int, frozenset[int]] | None = None) -> None:
        # ``master_addr``: the address rank 0 is told to serve at (an engine such as Ray
        # hands out the node's network address even when every rank is on one machine)
        self.python, self.master_addr = python, master_addr
        # torchrun-style ranks fork from this process's fork server: under ``phalanx
        # schedule`` a fork of the command itself (cli/schedule.py), in a program the
        # fresh-interpreter server (one ``import torch`` for all its ranks); ranks of
        # another Python start as fresh interpreters
        self.fork = python == sys.executable and supervise.START_METHOD == "forkserver"
        self.gangs: dict[str, list[RankProcess]] = {}
        self.failed: dict[str, tuple[tuple[int, int], ...]] = {}
        # device -> the cores its rank is pinned to (--pin-cores); empty: not pinned
        self.pins = dict(pins or {})

    def start(self, gang: Gang) -> None:
        try:
            port = free_port(self.master_addr)
        except OSError:   # not this host's address: rank 0 says so at once (netif)
            port = free_port("0.0.0.0")
        master = (self.master_addr, port)
        lw = local_world(gang, master[0])
        procs: list[RankProcess] = []
        slots = gang.ranks if gang.per_rank else gang.ranks[:1]
        try:
            for slot in slots:
                env = rank_env(gang, slot, master, slot.node, lw, slot.devices)
                # one driver process for the gang: the cores of all its devices
                cpus = self._cpus(slot.devices if gang.per_rank else
                                  tuple(d for r in gang.ranks for d in r.devices))
                if cpus:
                    env["PHALANX_CPUS"] = ",".join(map(str, sorted(cpus)))
                if self.fork and gang.per_rank and gang.argv[:2] == SCHEDULED:
                    procs.append(ForkedRank(gang.argv[2:], env, gang.log))
                else:
                    procs.append(RankProcess(self.python, gang.argv, env, gang.log,
                                             gang.per_rank))
                if cpus:
                    # at once, before its interpreter starts threads (a scheduled rank
                    # also pins itself from PHALANX_CPUS first thing)
                    with contextlib.suppress(ProcessLookupError):
                        os.sched_setaffinity(procs[-1].pid, cpus)
        except OSError:
            for p in procs:
                p.kill()
            raise
        self.gangs[gang.job] = procs

    def _cpus(self, devices: Sequence[int]) -> frozenset[int]:
        return frozenset().union(*(self.pins.get(d, frozenset()) for d in devices))

    def poll(self, job: str) -> int | None:
        procs = self.gangs[job]
        codes = [p.poll() for p in procs]
        note_failure(self.failed, job, codes)
        if failed_rank(codes):
            for p, c in zip(procs, codes):
                if c is None:
                    p.stop(2.0)
        rc = gang_exit(codes)
        if rc is not None:
            del self.gangs[job]
        return rc

    def stop(self, job: str, grace_s: float) -> None:
        for p in self.gangs.get(job, []):
            p.stop(grace_s)

    def down(self) -> frozenset[str]:
        return frozenset()    # this machine is every server: it is never lost alone

    def stop_leftovers(self, logs: Sequence[Path], grace_s: float) -> dict[str, int]:
        return {}    # every rank died with its scheduler (PR_SET_PDEATHSIG)

    def close(self) -> None:
        for procs in self.gangs.values():
            for p in procs:
                p.kill()
        self.gangs.clear()


SCHEDULED = ("-m", "phalanx.entry.scheduled")   # a torchrun-style rank's command


class ForkedRank(RankProcess):
    """A torchrun-style rank (``python -m phalanx.entry.scheduled ARGS``) forked from this
    process's fork server instead (:func:`phalanx.runtime.supervise.process_context`;
    under ``phalanx schedule`` a copy of the command,
    :func:`phalanx.runtime.command_fork.fork_server_from_here`).
    :mod:`phalanx.entry.forked_rank` gives it what ``RankProcess`` gives a fresh
    interpreter (its own session, SIGTERM held until its stop flag is armed, the log, the
    environment). Stopping, polling and exit codes are ``RankProcess``'s: the fork server
    reports the exit as Popen does (a negative signal number for a signal). ``argv``: the
    flags after ``-m phalanx.entry.scheduled``."""

    SESSION_WAIT_S = 10.0
    START_TRIES = 10        # a dead fork server: tries, 0.2 s apart, to start on a new one

    def __init__(self, argv: tuple[str, ...], env: Mapping[str, str], log: Path) -> None:
        # not RankProcess's __init__: no Popen here
        from phalanx.entry import forked_rank  # torch: never in Ray's actors (see LAZY)

        with open(log, "ab"):   # here, as RankProcess opens it: an OSError is the caller's
            pass
        full = dict(os.environ)
        full.update(env)
        for attempt in range(self.START_TRIES):
            self.proc = supervise.process_context().Process(
                target=forked_rank.main, args=(argv, full, os.getcwd(), str(log)),
                name=f"phalanx-scheduled-rank{env.get('RANK', '0')}")
            try:
                self.proc.start()
                break
            except (EOFError, ConnectionError) as e:
                # the fork server died (killed) before or while it forked this rank: once
                # it is reaped, multiprocessing starts a fresh one (found by the chaos
                # harness: the scheduler died of this EOFError with a traceback)
                if attempt == self.START_TRIES - 1:
                    raise OSError(f"the fork server died and no new one started ({e!r})"
                                  ) from None
                time.sleep(0.2)
        self.pid = self.proc.pid
        self.kill_at = float("inf")
        # until it leads its own session: a stop sent before would find no process group
        # (and a fork server's SIGTERM ignored). SIGTERM is blocked by then.
        deadline = time.monotonic() + self.SESSION_WAIT_S
        while self.proc.exitcode is None and _pgid(self.pid) != self.pid:
            if time.monotonic() > deadline:
                self.proc.kill()
                self.proc.join()
                raise OSError(f"rank process {self.pid} did not start its session in "
                              f"{self.SESSION_WAIT_S:g} s")
            time.sleep(0.001)

    def poll(self) -> int | None:
        rc = self.proc.exitcode
        if rc is None and time.monotonic() >= self.kill_at:
            self.signal(signal.SIGKILL)
        return rc

    def stop(self, grace_s: float) -> None:
        if self.proc.exitcode is None:
            self.signal(signal.SIGTERM)
            self.kill_at = min(self.kill_at, time.monotonic() + grace_s)

    def kill(self) -> int:
        self.signal(signal.SIGKILL)
        self.proc.join()
        return self.proc.exitcode


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:   # gone already (its exit code comes next)
        return -1


def core_pins(topology: Topology, cores: Sequence[int] | None = None
              ) -> dict[int, frozenset[int]]:
    """``--pin-cores``: PCIe switch ``w`` of the topology (over all servers, in order) is
    pinned to ``cores[w % len(cores)]`` of this machine (default: the cores this process
    may run on), and each device to its switch's core, so two jobs on one switch share
    that core and jobs on different switches do not (while there are as many cores as
    switches)."""
    cores = sorted(os.sched_getaffinity(0)) if cores is None else list(cores)
    return {d: frozenset({cores[topology.device_switch[d] % len(cores)]})
            for d in range(topology.num_devices)}


def local_engine(topology: Topology, options: EngineOptions,
                 stack: contextlib.ExitStack) -> Executor:
    pins = core_pins(topology) if options.pin_cores else None
    if pins is not None:
        used = sorted(set().union(*pins.values()))
        idle = sorted(os.sched_getaffinity(0) - set(used))
        print(f"--pin-cores: {topology.num_switches} PCIe switch(es) on core(s) "
              f"{', '.join(map(str, used))}"
              + (f"; core(s) {', '.join(map(str, idle))} idle (a topology with a switch "
                 f"per core uses them all: uniform:Z,R,S,G,SWITCHES)" if idle else ""),
              flush=True)
    return LocalExecutor(options.python, pins=pins)
