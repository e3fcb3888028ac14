"""Start the processes of one run on this machine and join them.

The parent owns the rendezvous (a ``TCPStore`` on 127.0.0.1 with a port the OS picks, so
no two runs race for a port); every child joins a gloo process group through it, sets
one intra-op thread (two cores are shared by all workers) and runs ``fn(rank, world, *args)``.
Under ``torchrun`` the same ``fn`` runs from :mod:`phalanx.entry.torchrun` instead.
"""

from __future__ import annotations

import datetime
import functools
import os
import shutil
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing  # noqa: F401 - registers tensor sharing for spawn

from phalanx.errors import PhalanxError
from phalanx.runtime import memlimit, preempt
from phalanx.runtime.exits import Death
from phalanx.runtime.signals import child_setup, make_run_tempdir
from phalanx.runtime.supervise import (
    ERROR_FILE,
    STOPPING,
    UP_FILE,
    default_name,
    mark,
    peer_lost,
    start,
    supervise,
)

DEFAULT_TIMEOUT_S = 120.0


class WorkerFailed(PhalanxError):
    """A process of the run failed; the message is that process's last error line."""


def _record_failure(error_dir: str, rank: int, e: BaseException) -> None:
    """Write when and why this rank failed (once): when one rank dies its peers fail too
    ("connection closed by peer"), and the parent reports the FIRST failure, the cause."""
    path = Path(error_dir, ERROR_FILE.format(rank=rank))
    if path.exists():
        return
    line = f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__
    path.write_text(f"{time.time():.6f} {line}\n")


def _child(rank: int, fn: Callable, world: int, port: int, timeout_s: float, backend: str,
           error_dir: str, args: tuple, parent_pid: int = 0) -> None:
    if parent_pid:
        child_setup(parent_pid)  # die with the driver; SIGINT is the driver's to handle
    torch.set_num_threads(1)
    try:
        _join(rank, world, port, timeout_s, backend)
        mark("joined")
        Path(error_dir, UP_FILE.format(rank=rank)).touch()  # the supervisor reads it
        try:
            fn(rank, world, *args)
        except preempt.Preempted:
            raise  # stopped on request, its state on disk: not a failure
        except BaseException as e:
            # an allocation past --memory-limit: one line naming it, not a traceback
            said = memlimit.explain(e, rank)
            _record_failure(error_dir, rank, said)  # before our connections close (os._exit)
            if said is not e:
                raise said from None
            raise
        # only after success: a failed or stopped rank leaves at once below (os._exit).
        # Destroying a gloo group waits for its operations in flight, and one blocked on a
        # peer that waits for this rank would hold the exit until --timeout
        # (tests/distributed/test_torchrun_failure_line.py: the torchrun entry's case)
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - the group may already be broken by a dead peer
            pass
    except preempt.Preempted:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(preempt.PREEMPTED_EXIT)  # the driver tells the run's stop in one line
    except BaseException as e:
        _record_failure(error_dir, rank, e)
        # a peer's death or the driver stopping the run is reported once, by the driver
        # (a peer's death can reach this rank before the driver has seen it: a sync rank
        # whose allreduce lost its peer printed its traceback above the driver's line)
        if not (isinstance(e, PhalanxError) or peer_lost(str(e))
                or Path(error_dir, STOPPING).exists()):
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # not raise: multiprocessing would print the traceback again
    # Success: every result is on disk and the group is destroyed. Leave without the
    # interpreter's teardown, where a backend's C++ thread destroyed while still joinable
    # aborted ~1 run in 6 ("terminate called without an active exception") after all the
    # work was done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _join(rank: int, world: int, port: int, timeout_s: float, backend: str) -> None:
    """Join the run's process group as ``rank`` (the rendezvous: every rank must)."""
    # one host: gloo binds loopback, not what the host name resolves to (netif.py)
    os.environ["GLOO_SOCKET_IFNAME"] = os.environ.get("GLOO_SOCKET_IFNAME") or "lo"
    store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def _stand_in(rank: int, world: int, port: int, timeout_s: float, backend: str,
              error_dir: str, parent_pid: int) -> None:
    """In a dead rank's place: join the group so its peers' rendezvous completes, then
    leave at once. Its peers see that rank's connections close, as after a death once
    the group formed (a parameter server drops the silent worker)."""
    child_setup(parent_pid)
    try:
        _join(rank, world, port, timeout_s, backend)
        Path(error_dir, UP_FILE.format(rank=rank)).touch()  # its place in the group formed
        dist.destroy_process_group()
    except BaseException as e:
        _record_failure(error_dir, rank, e)
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)  # no interpreter teardown (see _child)


def _published(store: dist.TCPStore, rank: int, world: int) -> bool:
    """Whether ``rank`` told a peer where to connect: gloo's rendezvous keys are
    ``PREFIX/RANK``. A peer reads another's key only after writing its own, so the dead
    rank's key matters only beside another rank's under the same prefix; then a stand-in
    (a new address under the same key) would come too late for that peer."""
    by_prefix: dict[str, set[str]] = {}
    for key in store.list_keys():
        prefix, _, last = key.rpartition("/")
        by_prefix.setdefault(prefix, set()).add(last)
    ranks = {str(r) for r in range(world)}
    return any(str(rank) in lasts and len(lasts & ranks) > 1 for lasts in by_prefix.values())


def _start_stand_in(store: dist.TCPStore, world: int, timeout_s: float, backend: str,
                    error_dir: str, rank: int) -> Any:
    """A :func:`_stand_in` process for dead ``rank``, or None when it would come too late."""
    if _published(store, rank, world):
        return None
    args = (rank, world, store.port, timeout_s, backend, error_dir, os.getpid())
    return start(_stand_in, world, lambda r: args, ranks=range(rank, rank + 1))[0]


def _first_failure(error_dir: str) -> tuple[int, str] | None:
    found = []
    for path in Path(error_dir).glob("rank*.err"):
        stamp, _, line = path.read_text().strip().partition(" ")
        try:
            found.append((float(stamp), int(path.stem[4:]), line))
        except ValueError:
            continue  # a child killed while writing it
    if not found:
        return None
    _, rank, line = min(found)
    return rank, line


def spawn(fn: Callable[..., Any], world: int, args: tuple = (), *, backend: str = "gloo",
          timeout_s: float = DEFAULT_TIMEOUT_S, survivable: Callable[[int], bool] | None = None,
          name: Callable[[int], str] = default_name, stand_ins: bool = True,
          note: Callable[[int], str] | None = None,
          saves_on_stop: Callable[[int], bool] | None = None, grace_s: float = 3.0,
          on_death: Callable[[Death], None] | None = None) -> list[Death]:
    """Run ``fn(rank, world, *args)`` in ``world`` fresh processes joined in one group.
    Returns the processes the run went on without (survivable deaths; ``on_death`` hears of
    each as the driver sees it).

    ``fn`` and ``args`` must be picklable; tensors inside ``args`` travel through shared
    memory, not copies. ``survivable(rank)``: that process may die by a signal without
    ending the run; ``name(rank)`` names it in messages (see :mod:`phalanx.runtime.supervise`).
    ``stand_ins``: a survivable process that dies before its group formed gets a stand-in
    in the rendezvous (the run goes on without it); False: that death ends the run at once
    (a run that would stop at the loss anyway need not wait to find out). ``note(rank)``:
    said after a killed process's name when its death ends the run. ``saves_on_stop(rank)``:
    that process answers SIGTERM by writing its state (``PREEMPTED_EXIT``); the driver gives
    it ``grace_s`` to, and says so when every one did (see :mod:`phalanx.runtime.supervise`).
    """
    # Bind the rendezvous to loopback ourselves: given only a host name, TCPStore listens on
    # every interface (seen with ss -ltnp). Port 0: the OS picks a free one, no races.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(world + 1)
    store = dist.TCPStore("127.0.0.1", listener.getsockname()[1], world + 1, is_master=True,
                          timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False,
                          master_listen_fd=listener.fileno())
    listener.detach()  # the store owns (and closes) the descriptor now
    error_dir, port = make_run_tempdir("phalanx-spawn-"), store.port
    try:
        procs = start(_child, world, lambda rank: (rank, fn, world, port, timeout_s,
                                                   backend, error_dir, args, os.getpid()))
        stand_in = functools.partial(_start_stand_in, store, world, timeout_s, backend,
                                     error_dir) if stand_ins else None
        return supervise(procs, error_dir, first_failure=_first_failure, fail=WorkerFailed,
                         survivable=survivable, name=name, stand_in=stand_in, note=note,
                         saves_on_stop=saves_on_stop, grace_s=grace_s, on_death=on_death)
    finally:
        shutil.rmtree(error_dir, ignore_errors=True)
        del store
