"""The Slurm backend: each rank is one Slurm batch job, pinned to the node and the devices
the scheduler chose; Slurm allocates and runs, it decides nothing.

* **Placement is ours.** A rank's job asks for its node (``--nodelist``) and for its
  devices by their typed GRES (``--gres=gpu:phx<id>:1``: one type per device, see
  :mod:`slurm_conf`), so Slurm can give it nothing else. Our allocator is all-or-nothing
  for the gang; the ranks' jobs mirror what it holds.
* **Devices are ours.** The batch script (:mod:`slurm_task`) checks that Slurm's
  allocation (``SLURM_JOB_GPUS``) is the devices we chose, sets ``CUDA_VISIBLE_DEVICES``
  from them and records the node Slurm ran it on (``SLURMD_NODENAME``), then becomes the
  rank's process: ``python -m phalanx.entry.scheduled`` with ``RANK / WORLD_SIZE /
  MASTER_ADDR / MASTER_PORT`` set by us (the scheduler is torchrun's agent, as on Ray).
* **Stops are ours.** ``stop`` is ``scancel --batch --signal=TERM`` to every rank's job (the
  rank checkpoints and exits 75), ``--signal=KILL`` once the grace period has passed;
  a rank still pending is cancelled. ``poll`` reads every job's state and exit status from
  one ``squeue`` call (cached for ``refresh_s``), decoded as ``Popen`` does (-N: signal N).
* A rank Slurm keeps pending longer than ``pending_s`` (another user's job holds its
  device on a shared cluster) fails its gang, with Slurm's reason in the job's log.
* **A scheduler restarted** (``--resume``): the ranks an earlier scheduler of the run left
  running are found by their output (the job's log) and stopped as for a preemption
  (:meth:`SlurmExecutor.stop_leftovers`): they checkpoint, and the job resumes from there.
* **Lost nodes** (:meth:`SlurmExecutor.down`): a node Slurm marks not responding (``*``: its
  ``slurmd`` did not answer the controller's last ping), down, drained or failing (``sinfo``,
  read at most every :data:`NODES_EVERY_S`). Not responding comes first, seconds after a
  ``slurmd`` dies (the controller pings every ``SlurmdTimeout`` / 3); down after
  ``SlurmdTimeout``, when its jobs end as ``NODE_FAIL``. Its devices come back when it
  answers again.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from phalanx.cluster.core.topology import Topology
from phalanx.cluster.live.engines.base import (
    KILLED,
    Gang,
    RankSlot,
    failed_rank,
    free_port,
    gang_exit,
    local_world,
    note_failure,
    rank_env,
)
from phalanx.cluster.live.engines.slurm.conf import gres_pattern, gres_request, gres_type
from phalanx.cluster.live.engines.slurm.local import SlurmTarget, run
from phalanx.errors import ConfigError

TASK = Path(__file__).with_name("task.py")
RUNNING = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
           "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD"}
GRES = re.compile(r"gpu:([^:,()]+):")
NODES_EVERY_S = 0.5
LOST_STATES = {"down", "drain", "drained", "draining", "fail", "failing"}


def lost(state: str) -> bool:
    """A node state of ``sinfo -o %T`` (``idle*``, ``down``, ``idle+drain``, ...) that takes
    the node's devices out of service."""
    state = state.strip().lower()
    return state.endswith("*") or any(part.rstrip("*~#!%$@^-") in LOST_STATES
                                      for part in state.split("+"))


def batch_script(python: str, spec: dict) -> str:
    """:mod:`slurm_task`'s text run by ``python`` on ``spec`` (read, never imported here:
    its first act is to block SIGTERM)."""
    return f"#!{python} -I\n{TASK.read_text()}\nmain(json.loads({json.dumps(json.dumps(spec))}))\n"


def decode(state: str, status: int) -> int:
    """A finished job's exit as ``Popen`` gives it: the code, or -signal. A job Slurm ended
    (cancelled, node failure, ...) never reads as a success."""
    code = -(status & 0x7F) if status & 0x7F else status >> 8
    if code == 0 and state != "COMPLETED":
        return KILLED if state == "CANCELLED" else 1
    return code


@dataclass
class _SlurmGang:
    ids: list[str]
    log: Path
    submitted: float
    kill_at: float = float("inf")
    stopping: bool = False
    codes: list[int | None] = field(default_factory=list)


class SlurmExecutor:
    """Gangs as Slurm batch jobs, one per rank (a driver gang: one job), on the nodes and
    devices the scheduler chose."""

    name = "slurm"

    def __init__(self, topology: Topology, target: SlurmTarget, python: str,
                 refresh_s: float = 0.1, pending_s: float = 120.0) -> None:
        self.topology, self.target, self.python = topology, target, python
        self.refresh_s, self.pending_s = refresh_s, pending_s
        self.addr = self._check_nodes()
        self.gangs: dict[str, _SlurmGang] = {}
        self.failed: dict[str, tuple[tuple[int, int], ...]] = {}
        self.states: dict[str, tuple[str, int, str]] = {}   # job id -> state, status, reason
        self.refreshed = 0.0
        # every job of this run carries it (--comment): close() finds even one whose sbatch
        # was interrupted before it told us the job's id
        self.tag = f"phalanx-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.signals: list[subprocess.Popen[bytes]] = []    # scancel calls in flight
        self._down: frozenset[str] = frozenset()
        self._nodes_at = -float("inf")

    # ------------------------------------------------------------------ the cluster
    def _slurm(self, *cmd: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return run([*self.target.where, *cmd], self.target.env, timeout)

    def _slurm_async(self, *cmd: str) -> None:
        """A command the loop need not wait for (a stop: the policy's round goes on)."""
        self.signals = [p for p in self.signals if p.poll() is None]
        self.signals.append(subprocess.Popen(
            [*self.target.where, *cmd], env={**os.environ, **self.target.env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def _check_nodes(self) -> dict[str, str]:
        """Every server is a node of the partition with one typed GRES per device; returns
        each node's address (where a gang's rank 0 serves the group)."""
        p = self.target.partition
        r = self._slurm("sinfo", "-h", "-N", "-p", p, "-o", "%N|%o|%G")
        if r.returncode != 0:
            raise ConfigError(f"--slurm-partition {p}: sinfo failed: "
                              f"{(r.stderr.strip().splitlines() or ['no output'])[-1][:200]}")
        have: dict[str, tuple[str, set[str]]] = {}
        for line in r.stdout.splitlines():
            name, addr, gres = (line.split("|") + ["", ""])[:3]
            have[name] = (addr, set(GRES.findall(gres)))
        for s in self.topology.servers:
            want = {gres_type(self.topology, d) for d in s.devices}
            if s.name not in have or not want <= have[s.name][1]:
                lack = "the node" if s.name not in have else \
                    "GRES " + ",".join(sorted(want - have[s.name][1]))
                raise ConfigError(
                    f"--slurm-partition {p}: --cluster {self.topology.name} server {s.name} "
                    f"lacks {lack}: each server must be a node of the partition with one GRES "
                    f"{gres_pattern(self.topology)} per device (docs/cluster.md, Slurm)")
        return {s.name: have[s.name][0] for s in self.topology.servers}

    def down(self) -> frozenset[str]:
        """The servers whose node Slurm has taken out of service (:func:`lost`)."""
        now = time.monotonic()
        if now - self._nodes_at < NODES_EVERY_S:
            return self._down
        self._nodes_at = now
        r = self._slurm("sinfo", "-h", "-N", "-p", self.target.partition, "-o", "%N|%T",
                        timeout=10)
        if r.returncode != 0:
            return self._down   # the controller did not answer: ask again next time
        state = dict(ln.split("|", 1) for ln in r.stdout.splitlines() if "|" in ln)
        self._down = frozenset(s.name for s in self.topology.servers
                               if lost(state.get(s.name, "down")))
        return self._down

    def stop_leftovers(self, logs: Sequence[Path], grace_s: float) -> dict[str, int]:
        """Stop the batch jobs an earlier scheduler of this run left behind (on an existing
        cluster a rank outlives its scheduler): this user's jobs whose output is one of
        ``logs`` (each job's log, ``OUT/logs/NAME.log``). SIGTERM to each rank (it
        checkpoints, as for a preemption), SIGKILL after ``grace_s``; returns how many were
        found per log's job name, once they are gone."""
        wanted = {str(p): p.stem for p in logs}
        r = self._slurm("squeue", "-h", "-u", str(os.getuid()), "-O",
                        "JobID:24,State:24,StdOut:4096")
        found: dict[str, list[str]] = {}
        for line in r.stdout.splitlines():
            cols = line.split(None, 2)
            if len(cols) == 3 and cols[2].strip() in wanted and cols[1] in RUNNING:
                found.setdefault(wanted[cols[2].strip()], []).append(cols[0])
                self.states[cols[0]] = (cols[1], 0, "")
        ids = [i for v in found.values() for i in v]
        if ids:
            self._signal(ids, "TERM")
            deadline, killed = time.monotonic() + grace_s, False
            while True:
                q = self._slurm("squeue", "-h", "-j", ",".join(ids), "-O", "JobID:24,State:24")
                live = [c[0] for c in (ln.split() for ln in q.stdout.splitlines())
                        if len(c) == 2 and c[1] in RUNNING]
                if not live or time.monotonic() > deadline + 30:
                    break
                if not killed and time.monotonic() > deadline:
                    self._signal(live, "KILL")
                    killed = True
                time.sleep(0.2)
            for i in ids:
                self.states.pop(i, None)
        return {k: len(v) for k, v in found.items()}

    def _master(self, node: str) -> tuple[str, int]:
        addr = self.addr[node]
        if addr.startswith("127.") or addr == "localhost":
            return "127.0.0.1", free_port()
        # another machine: a port we cannot test from here; rank 0 binds it on start
        return addr, random.randint(20000, 59999)

    # ------------------------------------------------------------------ start / stop
    def _submit(self, gang: Gang, slot: RankSlot, env: dict[str, str]) -> str:
        spec = {"job": gang.job, "rank": slot.rank, "local": list(slot.local), "env": env,
                "cwd": os.getcwd(), "hold_term": gang.per_rank, "python": self.python,
                "argv": list(gang.argv)}
        cmd = ["sbatch", "--parsable", f"--job-name=phalanx-{gang.job}-{gang.start}-{slot.rank}",
               f"--partition={self.target.partition}", f"--nodelist={slot.node}",
               f"--gres={gres_request(self.topology, slot.devices)}", "--ntasks=1",
               "--cpus-per-task=1",
               f"--output={gang.log}", "--open-mode=append", "--no-requeue",
               f"--comment={self.tag}",
               f"--chdir={os.getcwd()}"]
        r = subprocess.run([*self.target.where, *cmd], input=batch_script(self.python, spec),
                           text=True,
                           capture_output=True, env={**os.environ, **self.target.env},
                           timeout=60, check=False)
        if r.returncode != 0:
            raise OSError(f"sbatch: {(r.stderr.strip().splitlines() or ['failed'])[-1][:200]}")
        return r.stdout.strip().split(";")[0]

    def start(self, gang: Gang) -> None:
        slots = gang.ranks if gang.per_rank else gang.ranks[:1]
        master = self._master(slots[0].node)
        lw = local_world(gang, master[0])
        ids: list[str] = []
        try:
            for s in slots:
                ids.append(self._submit(gang, s, rank_env(gang, s, master, s.node, lw,
                                                          s.local)))
        except (OSError, subprocess.TimeoutExpired) as e:
            self._cancel(ids)
            raise OSError(str(e)) from None
        self.gangs[gang.job] = _SlurmGang(ids, gang.log, time.monotonic(),
                                          codes=[None] * len(ids))

    def _signal(self, ids: list[str], sig: str) -> None:
        """``sig`` to the running ones of ``ids`` (to the batch step: the rank itself; a
        signal to the whole job would be a cancel, KILL only after ``KillWait``); the
        pending ones are cancelled."""
        pending = [i for i in ids if self.states.get(i, ("PENDING",))[0] == "PENDING"]
        running = [i for i in ids if i not in pending]
        if running:
            self._slurm_async("scancel", "--batch", f"--signal={sig}", *running)
        if pending:
            self._slurm_async("scancel", *pending)

    def _cancel(self, ids: list[str]) -> None:
        if ids:
            self._signal(ids, "KILL")

    def stop(self, job: str, grace_s: float) -> None:
        g = self.gangs.get(job)
        if g is None:
            return
        live = [i for i, c in zip(g.ids, g.codes) if c is None]
        self._signal(live, "TERM")
        g.stopping = True
        g.kill_at = min(g.kill_at, time.monotonic() + grace_s)

    # ------------------------------------------------------------------ poll
    def _refresh(self) -> None:
        now = time.monotonic()
        ids = [i for g in self.gangs.values() for i, c in zip(g.ids, g.codes) if c is None]
        if not ids or now - self.refreshed < self.refresh_s:
            return
        r = self._slurm("squeue", "-h", "--states=all", "-j", ",".join(ids), "-O",
                        "JobID:24,State:24,exit_code:12,Reason:300")
        if r.returncode != 0 and "Invalid job id" not in r.stderr:
            return   # the controller did not answer: ask again next time
        self.refreshed = now
        seen = set()
        for line in r.stdout.splitlines():
            cols = line.split(None, 3)
            if len(cols) >= 3 and cols[2].isdigit():
                seen.add(cols[0])
                self.states[cols[0]] = (cols[1], int(cols[2]), (cols[3:] or [""])[0].strip())
        for i in ids:   # purged from the controller before we saw it end
            if i not in seen:
                self.states[i] = ("LOST", 0, "the controller no longer knows the job")

    def _code(self, job_id: str) -> int | None:
        state, status, _ = self.states.get(job_id, ("PENDING", 0, ""))
        return None if state in RUNNING else decode(state, status)

    def poll(self, job: str) -> int | None:
        self._refresh()
        g = self.gangs[job]
        g.codes = [c if c is not None else self._code(i) for i, c in zip(g.ids, g.codes)]
        live = [i for i, c in zip(g.ids, g.codes) if c is None]
        note_failure(self.failed, job, g.codes)
        now = time.monotonic()
        if live and now >= g.kill_at:
            self._cancel(live)
            g.kill_at = float("inf")
        elif failed_rank(g.codes) and not g.stopping:
            self.stop(job, 2.0)
        elif live and now - g.submitted > self.pending_s:
            self._pending_too_long(job, g, live)
        rc = gang_exit(g.codes)
        if rc is not None:
            del self.gangs[job]
            for i in g.ids:
                self.states.pop(i, None)
        return rc

    def _pending_too_long(self, job: str, g: _SlurmGang, live: list[str]) -> None:
        waiting = [i for i in live if self.states.get(i, ("PENDING",))[0] == "PENDING"]
        if not waiting:
            return
        reason = self.states.get(waiting[0], ("", 0, ""))[2] or "no reason given"
        with open(g.log, "a") as f:
            f.write(f"phalanx: error: Slurm kept job {waiting[0]} of {job} pending for "
                    f"{self.pending_s:g} s ({reason}): are its devices held by other jobs?\n")
        self._cancel(live)
        g.submitted = float("inf")

    def close(self) -> None:
        for p in self.signals:   # a stop in flight lands before the kill
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        self.refreshed = 0.0
        self._refresh()   # which are pending (cancelled) and which run (killed)
        ids = [i for g in self.gangs.values() for i, c in zip(g.ids, g.codes) if c is None]
        self._cancel(ids)
        self.gangs.clear()
        # a job submitted while we were interrupted, before sbatch printed its id
        q = self._slurm("squeue", "-h", "-u", str(os.getuid()), "-o", "%A|%k")
        strays = [ln.split("|")[0] for ln in q.stdout.splitlines()
                  if ln.split("|")[1:] == [self.tag] and ln.split("|")[0] not in ids]
        if strays:
            self._slurm_async("scancel", *strays)
        for p in self.signals:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
