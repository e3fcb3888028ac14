"""The fork server forked from the ``phalanx`` command (``command_fork.fork_server_from_here``),
with real processes: ranks are its children, it ignores SIGTERM as the fresh-interpreter
server does, it ends with the process that started it (``kill -9`` included), it does not
hold that process's end of the "alive" pipe, and a process in a state unsafe to fork from
gets the fresh-interpreter server instead."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import stacks

from phalanx.runtime.command_fork import FORK_SERVER_NAME

DRIVER = r"""
import os, signal, sys, threading, time
import torch
from phalanx.runtime import command_fork, supervise
if sys.argv[1] == "thread":  # a Python thread: not a state to fork from
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
forked = command_fork.fork_server_from_here()
again = command_fork.fork_server_from_here()
ctx = supervise.process_context()
rank = ctx.Process(target=time.sleep, args=(1.5,))
rank.start()
time.sleep(0.5)
with open(f"/proc/{rank.pid}/stat") as f:
    server = int(f.read().rsplit(")", 1)[1].split()[1])
print(forked, again, server, rank.pid, flush=True)
if sys.argv[1] == "kill":
    os.kill(server, signal.SIGTERM)  # ignored: it must outlive its ranks' checkpoints
    time.sleep(0.3)
    rank.join()
    print(rank.exitcode, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
rank.join()
print(rank.exitcode, flush=True)
"""


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def _start(mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", DRIVER, mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_ranks_fork_from_a_fork_of_the_driver_which_ends_with_it_even_on_kill_9() -> None:
    p = _start("kill")
    first = p.stdout.readline().split()
    assert first[:2] == ["True", "False"], (first, p.stderr.read() if p.poll() else "")
    server, rank = int(first[2]), int(first[3])
    assert _ppid(server) == p.pid and _comm(server) == FORK_SERVER_NAME
    assert server != p.pid and rank != server
    # the rank finished although its server got SIGTERM, which the server ignores
    assert p.stdout.readline().strip() == "0"
    p.wait(timeout=10)
    assert p.returncode == -signal.SIGKILL
    # the driver gone, the server's "alive" pipe is at EOF: the server held no write end
    gone = _gone(server, 5.0)
    if not gone:
        os.kill(server, signal.SIGKILL)  # not left behind by a failing test
    assert gone, f"fork server {server} outlived its driver"
    p.stderr.close()
    p.stdout.close()


def test_a_driver_with_a_thread_gets_the_fresh_interpreter_server() -> None:
    p = _start("thread")
    first = p.stdout.readline().split()
    assert first[:2] == ["False", "False"], (first, p.stderr.read() if p.poll() else "")
    server = int(first[2])
    cmdline = Path(f"/proc/{server}/cmdline").read_bytes().decode(errors="replace")
    assert "multiprocessing.forkserver" in cmdline and _comm(server) != FORK_SERVER_NAME
    out, err = p.communicate(timeout=60)
    assert out.strip() == "0" and p.returncode == 0, err


def test_the_cli_run_leaves_no_fork_server(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "phalanx.cli", "train", "--strategy", "sync",
                        "--workers", "2", "--model", "mlp", "--data", "synthetic",
                        "--max-steps", "5", "--no-tensorboard", "--no-progress", "--out",
                        str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if _comm(int(pid)) == FORK_SERVER_NAME and str(out) in Path(
                    f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                left.append(pid)
        except OSError:
            pass
    assert not left


def test_a_long_tmpdir_puts_the_servers_socket_under_tmp(tmp_path: Path) -> None:
    """A TMPDIR too long for an AF_UNIX path (107 bytes) with the server's socket below it
    was a traceback (``OSError: AF_UNIX path too long``) for every multi-process run: the
    socket's folder goes to /tmp instead, and the run trains."""
    temp = tmp_path / ("t" * 80)
    temp.mkdir()
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "phalanx.cli", "train", "--strategy", "sync",
                        "--workers", "2", "--model", "mlp", "--data", "synthetic",
                        "--max-steps", "5", "--no-tensorboard", "--no-progress", "--out",
                        str(out)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TMPDIR": str(temp)})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert json.loads((out / "summary.json").read_text())["steps"] == 5
    assert not list(temp.iterdir())


def test_a_script_without_a_main_guard_is_told_what_to_change(tmp_path: Path) -> None:
    """multiprocessing runs the driver's script again in each rank it starts; a script that
    calls phalanx.train at its top level (no ``if __name__ == "__main__":``) started a
    second run there: a traceback from every rank (multiprocessing's RuntimeError) and
    "worker 0 exited with code 1". Each rank now exits at once (REIMPORTED_MAIN_EXIT), the
    driver's error says what to change, and the same script with the guard trains."""
    body = ('phalanx.train("mlp", "synthetic", strategy="sync", workers=2, max_steps=5, '
            f'progress=False, tensorboard=False, out={str(tmp_path / "run")!r}, '
            'overwrite=True)\nprint("trained")\n')
    bare = tmp_path / "bare.py"
    bare.write_text("import phalanx\n" + body)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(bare)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "trained" not in r.stdout, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("phalanx.runtime.launch.WorkerFailed: worker ") and last.endswith(
        'put that call under `if __name__ == "__main__":`'), r.stderr
    assert "RuntimeError" not in r.stderr and r.stderr.count("Traceback") == 1, r.stderr
    assert time.monotonic() - t0 < 60
    guarded = tmp_path / "guarded.py"
    guarded.write_text("import phalanx\nif __name__ == '__main__':\n"
                       + "".join(f"    {line}\n" for line in body.splitlines()))
    r = subprocess.run([sys.executable, str(guarded)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "trained", r.stdout + r.stderr


def _is_server_of(pid: int, parent: int) -> bool:
    try:
        return _ppid(pid) == parent and _comm(pid) == FORK_SERVER_NAME
    except (OSError, IndexError):
        return False  # gone meanwhile


def test_a_resumed_run_forks_its_ranks_from_the_command_too(tmp_path: Path) -> None:
    """``phalanx train --resume DIR`` reads the run's strategy from DIR before anything
    starts and forks its fork server from itself, as a fresh run does (it started a fresh
    interpreter that imported torch again: ~1.5 s of CPU per resume, each preemption of a
    scheduled parameter-server job). The resumed run then finishes."""
    out = tmp_path / "run"
    flags = ["--no-tensorboard", "--no-progress"]
    p = subprocess.Popen([sys.executable, "-m", "phalanx.cli", "train", "--strategy", "asp",
                          "--workers", "2", "--model", "mlp", "--data", "synthetic",
                          "--max-steps", "1500", "--checkpoint-every", "5", *flags,
                          "--out", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (out / "ps_shard0.ckpt").exists() and p.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint"
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 75, err
    r = subprocess.Popen([sys.executable, "-m", "phalanx.cli", "train", "--resume", str(out),
                          "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    server = []
    deadline = time.monotonic() + 30
    while not server and r.poll() is None and time.monotonic() < deadline:
        server = [k for k in stacks.tree(r.pid)[1:] if _is_server_of(k, r.pid)]
        time.sleep(0.05)
    _, err = r.communicate(timeout=120)
    assert server, "the resumed run's fork server was not a fork of the command"
    assert r.returncode == 0, err
    assert json.loads((out / "summary.json").read_text())["steps"] > 0
