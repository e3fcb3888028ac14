"""Start the processes of one run on this machine and join them.

The parent owns the rendezvous (a ``TCPStore`` on 127.0.0.1 with a port the OS picks, so
no two runs race for a port); every child joins a gloo process group through it, sets
one intra-op thread (two cores are shared by all workers) and runs ``fn(rank, world, *args)``.
Under ``torchrun`` the same ``fn`` runs via :func:`run_under_torchrun` instead.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from phalanx.errors import PhalanxError

DEFAULT_TIMEOUT_S = 120.0


class WorkerFailed(PhalanxError):
    """A process of the run failed; the message is that process's last error line."""


def _record_failure(error_dir: str, rank: int, e: BaseException) -> None:
    """Write when and why this rank failed (once): when one rank dies its peers fail too
    ("connection closed by peer"), and the parent reports the FIRST failure, the cause."""
    path = Path(error_dir, f"rank{rank}.err")
    if path.exists():
        return
    line = f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__
    path.write_text(f"{time.time():.6f} {line}\n")


def _child(rank: int, fn: Callable, world: int, port: int, timeout_s: float, backend: str,
           error_dir: str, args: tuple) -> None:
    torch.set_num_threads(1)
    # one host: gloo binds loopback, not what the host name resolves to (netif.py)
    os.environ["GLOO_SOCKET_IFNAME"] = os.environ.get("GLOO_SOCKET_IFNAME") or "lo"
    try:
        store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False,
                              timeout=datetime.timedelta(seconds=timeout_s))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        try:
            fn(rank, world, *args)
        except BaseException as e:
            _record_failure(error_dir, rank, e)  # before our connections close below
            raise
        finally:
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - the group may already be broken by a dead peer
                pass
    except BaseException as e:
        _record_failure(error_dir, rank, e)
        if not isinstance(e, PhalanxError):
            traceback.print_exc()
        raise
    # Success: every result is on disk and the group is destroyed. Leave without the
    # interpreter's teardown, where a backend's C++ thread destroyed while still joinable
    # aborted ~1 run in 6 ("terminate called without an active exception") after all the
    # work was done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _first_failure(error_dir: str) -> tuple[int, str] | None:
    found = []
    for path in Path(error_dir).glob("rank*.err"):
        stamp, _, line = path.read_text().strip().partition(" ")
        found.append((float(stamp), int(path.stem[4:]), line))
    if not found:
        return None
    _, rank, line = min(found)
    return rank, line


def spawn(fn: Callable[..., Any], world: int, args: tuple = (), *, backend: str = "gloo",
          timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Run ``fn(rank, world, *args)`` in ``world`` fresh processes joined in one group.

    ``fn`` and ``args`` must be picklable; tensors inside ``args`` travel through shared
    memory, not copies.
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
    with tempfile.TemporaryDirectory(prefix="phalanx-spawn-") as error_dir:
        try:
            mp.start_processes(_child, args=(fn, world, store.port, timeout_s, backend,
                                             error_dir, args),
                               nprocs=world, start_method="spawn", join=True)
        except mp.ProcessRaisedException as e:
            first = _first_failure(error_dir)
            if first is not None:
                raise WorkerFailed(f"process {first[0]} failed: {first[1]}") from None
            lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
            raise WorkerFailed(
                f"process {e.error_index} failed: {lines[-1] if lines else e}") from None
        except mp.ProcessExitedException as e:
            first = _first_failure(error_dir)
            if first is not None:
                raise WorkerFailed(f"process {first[0]} failed: {first[1]}") from None
            raise WorkerFailed(
                f"process {e.error_index} exited with code {e.exit_code}"
                + (f" ({e.signal_name})" if getattr(e, "signal_name", None) else "")
            ) from None
        finally:
            del store


def run_under_torchrun(fn: Callable[..., Any], args: tuple = (), *, backend: str = "gloo",
                       timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Entry for ``torchrun``: rank and world come from its environment."""
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    try:
        fn(dist.get_rank(), dist.get_world_size(), *args)
    finally:
        dist.destroy_process_group()
