"""The local engine's torchrun-style ranks, forked from the ``phalanx schedule`` command's own
fork server (``engines/local.py: ForkedRank``, ``entry/forked_rank.py``), with real
processes: each rank is a child of the fork server, which is a child of the scheduler; it
leads its own session; a stop sent the moment it starts is answered as a fresh
interpreter's rank answers it (a checkpoint and PREEMPTED_EXIT when the job can be
preempted, death by SIGTERM when not); and ``kill -9`` of the scheduler takes the server
and the ranks with it within seconds, though a rank holds what multiprocessing hands every
process it forks (the server's "alive" pipe)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from live_procs import alive, gone

from phalanx.runtime import rank_record
from phalanx.runtime.command_fork import FORK_SERVER_NAME
from phalanx.runtime.stop_flag import PREEMPTED_EXIT

REPO = Path(__file__).resolve().parents[2]
LONG = ("jobs:\n  - {name: A, arrival: 0, gpus: 2, config: {model: mlp, data: synthetic, "
        "epochs: 1000, strategy: sync, tensorboard: false}}\n")


def _stat(pid: int) -> tuple[str, int]:
    """(state, parent pid) of a process."""
    rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return rest[0], int(rest[1])


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def test_ranks_are_forks_of_the_schedulers_server_and_die_with_its_kill_9(tmp_path):
    jobs, out = tmp_path / "jobs.yaml", tmp_path / "out"
    jobs.write_text(LONG)
    p = subprocess.Popen([sys.executable, "-m", "phalanx.cli", "schedule", "--jobs", str(jobs),
                          "--cluster", "uniform:1,1,1,2", "--out", str(out)], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ranks: list[int] = []
    try:
        events = out / "jobs" / "A" / "events.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and p.poll() is None and not (
                events.exists() and '"kind": "train"' in events.read_text()):
            time.sleep(0.05)
        assert p.poll() is None, p.communicate()[1]
        ranks += [r.pid for r in rank_record.read(out / "ranks" / "A.jsonl")]
        assert len(ranks) == 2
        servers = {_stat(r)[1] for r in ranks}
        assert len(servers) == 1, servers      # both from one fork server ...
        server = servers.pop()
        assert _comm(server) == FORK_SERVER_NAME and _stat(server)[1] == p.pid  # ... ours
        for r in ranks:
            assert os.getsid(r) == r and os.getpgid(r) == r   # its own session
        ready = [json.loads(ln) for ln in events.read_text().splitlines()
                 if '"kind": "ready"' in ln]
        assert len(ready) == 2 and all("forked_unix" in e for e in ready), ready

        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        assert gone([server, *ranks]), "the fork server or a rank outlived the scheduler's " \
                                       "kill -9"
    finally:
        if p.poll() is None:
            p.kill()
        for pid in ranks:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)   # a failed check ends here, not a job later
        p.communicate(timeout=30)


# a program that forks its fork server from itself, as ``phalanx schedule`` does, starts a
# 2-rank sync gang through the local engine and stops it at once. The ranks' record file is
# a FIFO no one reads yet: each rank blocks opening it (``scheduled.prepare``), after its
# start returned and before it arms its stop flag, so the stop lands in that window for
# sure; then the FIFO is read and the ranks go on. Prints, per rank, whether SIGTERM was
# held (blocked, or caught by the stop flag) and not ignored when its start returned
# (/proc/PID/status); then the gang's exit code
STOP_AT_ONCE = """
import os, signal, sys, time
from pathlib import Path
from phalanx.runtime import command_fork
from phalanx.runtime.supervise import preload
preload("phalanx.entry.forked_rank")
assert command_fork.fork_server_from_here()
from phalanx.cluster.live.engines.base import Gang, RankSlot
from phalanx.cluster.live.engines.local import LocalExecutor
tmp, preemptible = Path(sys.argv[1]), sys.argv[2] == "1"
ex = LocalExecutor()
assert ex.fork
fifo = tmp / "A.jsonl"
os.mkfifo(fifo)
flags = ("--strategy", "sync", "--workers", "2", "--model", "mlp", "--data", "synthetic",
         "--epochs", "1000", "--out", str(tmp / "run"), "--no-progress", "--no-tensorboard")
ex.start(Gang("A", 0, ("-m", "phalanx.entry.scheduled", *flags),
              (RankSlot(0, 0, "n", (0,), (0,)), RankSlot(1, 0, "n", (1,), (1,))), True,
              preemptible, tmp / "A.log", fifo))
held = []
for proc in ex.gangs["A"]:
    st = dict(ln.split(":\\t") for ln in open(f"/proc/{proc.pid}/status").read().splitlines()
              if ":\\t" in ln)
    bit = 1 << (signal.SIGTERM - 1)
    held.append(bool((int(st["SigBlk"], 16) | int(st["SigCgt"], 16)) & bit)
                and not int(st["SigIgn"], 16) & bit)
ex.stop("A", 30.0)
time.sleep(0.5)   # a SIGTERM that is not held has ended its rank by now
reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
print(*held)
while (rc := ex.poll("A")) is None:
    try:
        os.read(reader, 65536)
    except BlockingIOError:
        pass
    time.sleep(0.01)
print(rc)
"""


def _stopped_at_once(tmp: Path, preemptible: bool) -> tuple[list[str], int]:
    tmp.mkdir()
    r = subprocess.run([sys.executable, "-c", STOP_AT_ONCE, str(tmp), "1" if preemptible
                        else "0"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    *held, code = r.stdout.split()
    return held, int(code)


def test_a_stop_at_once_is_a_checkpoint_or_sigterm_as_for_a_fresh_interpreter(tmp_path):
    # the stop may come before a rank has armed its stop flag: it waits, blocked, and is
    # answered with a checkpoint at the first step both ranks agree on
    assert _stopped_at_once(tmp_path / "p", True) == (["True", "True"], PREEMPTED_EXIT)
    assert (tmp_path / "p" / "run" / "checkpoint.pt").exists()
    log = (tmp_path / "p" / "A.log").read_text()
    assert log.count("phalanx: preempted at step ") == 2, log
    # a job that cannot be preempted dies of the SIGTERM (not ignored, as by the server)
    assert _stopped_at_once(tmp_path / "n", False)[1] == -signal.SIGTERM
    assert not (tmp_path / "n" / "run" / "checkpoint.pt").exists()
