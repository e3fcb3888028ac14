"""Start the processes of a run and watch them until they end (the driver's side).

Rules, in order, each time a process ends:

* exit 0: done;
* killed by a signal (``kill -9``, the OOM killer, a segfault) and ``survivable(rank)``,
  after its process group formed (every rank past the rendezvous): the run goes on
  without it, with one line saying so.
  The parameter-server strategies mark their workers survivable: the servers notice the
  silence through heartbeats and drop the worker after ``--ps-timeout``
  (``--on-worker-loss`` decides what then), exactly as they do for an injected
  ``--kill-worker`` (which kills with SIGKILL too);
* the same death *before* the group formed: its peers wait for it in the rendezvous.
  ``stand_in(rank)`` may start a process that takes its place there and leaves at once,
  so the group forms and the servers lose that worker as above (one line says so).
  Without a stand-in (or when none can take the place: the dead rank had already told
  its peers where to connect) the run ends at once (within the 1 s poll), in one line
  naming the process and the signal;
* anything else ends the run: the other processes are stopped (SIGTERM, then SIGKILL) and
  :class:`~phalanx.runtime.launch.WorkerFailed` names the process by its role
  (``worker 1``) with the first error any process recorded (the cause; its peers fail
  after it).

An interrupt of the driver (Ctrl-C, SIGTERM: see :mod:`phalanx.runtime.signals`) stops
every child the same way before it propagates, so no process outlives the run. Processes
that answer SIGTERM by writing their state (``saves_on_stop``: the parameter server's
shards) get ``grace_s`` to; when every one of them exited with ``PREEMPTED_EXIT`` the
interrupt carries ``saved = True`` (the CLI then says the run can continue from there).
A scheduler that stops the run signals the whole process group: the ranks get SIGTERM at
the same moment as the driver, and the fork server ignores it (``runtime/preloaded.py``).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from multiprocessing import reduction
from pathlib import Path
from typing import Any

from phalanx.errors import PhalanxError
from phalanx.runtime import exits
from phalanx.runtime.exits import Death, describe_exit
from phalanx.runtime.signals import make_run_tempdir, socket_temp_root
from phalanx.runtime.stop_flag import PREEMPTED_EXIT

STOPPING = "stopping"  # file in the error folder: the driver is stopping everyone
ERROR_FILE = "rank{rank}.err"  # where a child records its first error (launch.py)
UP_FILE = "rank{rank}.up"  # written by a child (or stand-in) once past the rendezvous
ORPHAN_GRACE_S = 10.0  # survivable processes left after the others finished: stopped then
PEER_GRACE_S = 1.0  # a failure that names a lost peer waits this long for the peer's own end


def default_name(rank: int) -> str:
    return f"process {rank}"


def refuse_reimported_main() -> None:
    """In a rank that is running the driver's script on starting (see
    :data:`exits.REIMPORTED_MAIN_EXIT`): exit at once, before a second run starts processes of
    its own (multiprocessing would refuse that with a traceback in every rank)."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        sys.stderr.flush()
        os._exit(exits.REIMPORTED_MAIN_EXIT)


# What every rank imports before it can do anything (~2 s of CPU for torch alone, per
# process, on a 2-core machine): loaded once, in the fork server, and inherited by each
# forked rank instead of imported again.
PRELOAD = ["torch", "torch.distributed", "numpy", "phalanx.runtime.launch",
           "phalanx.parallel.registry"]
_CONTEXT: list = []
PIPELINING = "torch.distributed.pipelining"
PRELOADED = "phalanx.runtime.preloaded"  # imported last: when the preloading ended
# "spawn" (a fresh interpreter per rank, as before issue 24) only for bench/startup.py's
# before/after comparison
START_METHOD = "forkserver"


def preload(*modules: str) -> None:
    """More for the fork server to import, when a run's ranks will need it (the pipelines'
    ``torch.distributed.pipelining``: ~1.5 s, not worth it for every run). Call before the
    run's first rank starts; once the server is up it changes nothing."""
    PRELOAD.extend(m for m in modules if m not in PRELOAD)
    if _CONTEXT and START_METHOD == "forkserver":
        _CONTEXT[0].set_forkserver_preload(_preload_list())  # for a server started later


def _preload_list() -> list[str]:
    """:data:`PRELOAD`, what the driver's main module imports, then :data:`PRELOADED`.

    multiprocessing runs the driver's main module again in every rank it starts (as
    ``__mp_main__``, so that its functions unpickle): the ``phalanx`` command's script and
    ``python -m phalanx.cli`` import ``phalanx.cli`` and its imports (every sub-command:
    cluster, experiments) in each rank, 0.5 s of CPU per rank, measured. The fork server
    imports them once and each rank finds them loaded. (multiprocessing's own ``"__main__"``
    preload does nothing here: the server is never told the main path.)"""
    return [*PRELOAD, *_main_imports(), PRELOADED]


def _main_imports() -> list[str]:
    """The modules the driver's main module took its names from. A module run with
    ``python -m NAME`` stays out itself: run again on top of an imported copy, runpy warns
    in every rank."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if main is None or (spec is not None and spec.name.endswith("__main__")):
        return []  # a package's __main__ is never run again in a rank
    names = set()
    for key, value in vars(main).items():
        if key.startswith("__"):
            continue  # __spec__, __loader__, __builtins__: the module's own machinery
        name = value.__name__ if isinstance(value, type(sys)) else getattr(value, "__module__",
                                                                            None)
        if isinstance(name, str) and name in sys.modules:
            names.add(name)
    return sorted(names - set(PRELOAD) - {spec.name if spec is not None else "__main__"})


def process_context():
    """The start method of every rank: a fork server that has imported :data:`PRELOAD`
    and what the driver's main module imports (started on first use, one per driver
    process, gone with it). A rank is a fork of it, never a fresh interpreter: no per-rank
    ``import torch``. The fork server has started no thread of its own and touched no GPU,
    so forking it is safe (unlike forking the driver); the idle BLAS thread pools that
    numpy and scipy start on import are fork-aware (pthread_atfork)."""
    if not _CONTEXT:
        ctx = multiprocessing.get_context(START_METHOD)
        if START_METHOD == "forkserver":
            ctx.set_forkserver_preload(_preload_list())
            _own_temp_dir()
        _CONTEXT.append(ctx)
    return _CONTEXT[0]


MP_TEMP = "phalanx-mp-"


def _own_temp_dir() -> None:
    """multiprocessing keeps the fork server's socket in a temp folder of its own
    (``pymp-*``), removed when the driver exits; a driver killed by SIGKILL leaves it
    behind, and nothing tells it from another program's. Name it ``phalanx-mp-<pid>-*``
    instead, so the next run sweeps it (:func:`~phalanx.runtime.signals.sweep_stale_dirs`),
    as it sweeps the ``phalanx-spawn-*`` folders. The folder lives as long as the driver
    (the fork server's socket must) and is removed at its exit as multiprocessing's own."""
    from multiprocessing import process, util

    config = getattr(process.current_process(), "_config", None)
    if not isinstance(config, dict) or config.get("tempdir") is not None:
        return   # set already (an earlier fork server), or a Python without this hook
    # the server's socket (``listener-`` and 8 characters) must fit an AF_UNIX path
    root = socket_temp_root(len(f"/{MP_TEMP}{os.getpid()}-") + 8 + len("/listener-") + 8,
                            "the fork server's socket")
    path = make_run_tempdir(MP_TEMP, root)
    remove = getattr(util, "_remove_temp_dir", None)   # also resets the config's entry
    util.Finalize(None, remove or shutil.rmtree,
                  args=(shutil.rmtree, path) if remove else (path, True), exitpriority=-100)
    config["tempdir"] = path


class Inherit:
    """What a forked rank takes from the driver as it is *now*, as a spawned process would:
    the environment, the working directory, stdout and stderr (the fork server's are the
    driver's at the time it started; a test or a caller may have changed them since)."""

    def __init__(self) -> None:
        self.env, self.cwd = dict(os.environ), os.getcwd()

    def __reduce__(self):  # pickled while the rank is being started: the fds travel too
        return (_inherited, (self.env, self.cwd, *(_dup(fd) for fd in (1, 2))))


def _dup(fd: int):
    try:
        os.fstat(fd)
    except OSError:  # the driver has no such stream: the rank keeps the server's
        return None
    return reduction.DupFd(fd)


# When this process (a rank) reached each start-up point, in unix seconds: ``preloaded``
# (its fork server had imported PRELOAD), ``forked`` (its first code ran), ``imported``
# (its target and arguments unpickled, i.e. imported), ``joined`` (its process group
# formed; runtime/launch.py). Empty in a driver or a rank someone else started. The
# rank's ``ready`` event carries them (metrics/throughput.py).
_MARKS: dict[str, float] = {}


def mark(point: str) -> None:
    """Note that this rank reached start-up ``point`` now."""
    _MARKS[point] = time.time()


def launch_marks() -> dict[str, float]:
    """This rank's start-up points (``forked_unix``, ...) for its ``ready`` event."""
    return {f"{k}_unix": v for k, v in _MARKS.items()}


def _inherited(env: dict, cwd: str, *streams) -> None:
    """Unpickled first thing in the rank: take the driver's streams, environment, folder;
    SIGTERM's default action back (the fork server ignores it, runtime/preloaded.py: a rank
    stopped while it starts must still end at once)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    mark("forked")
    server = sys.modules.get(PRELOADED)  # a fork of the fork server: when it had preloaded
    if server is not None:
        _MARKS["preloaded"] = server.AT
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, stream in zip((1, 2), streams):
        if stream is not None:
            got = stream.detach()
            os.dup2(got, fd)
            os.close(got)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)


def _ranked(inherit: None, target: Callable[..., Any], args: tuple) -> None:
    """A rank's first code: the driver's state is in place (unpickling ``Inherit`` applied
    it), then the rank's own work."""
    mark("imported")  # unpickling the target and its arguments imported what they need
    target(*args)


def start(target: Callable[..., Any], world: int, args: Callable[[int], tuple],
          ranks: range | None = None) -> list:
    """``world`` processes running ``target(*args(rank))``, forked from the pre-loaded
    fork server (:func:`process_context`); ``ranks``: only these (a stand-in)."""
    ctx = process_context()
    procs = []
    try:
        for rank in ranks if ranks is not None else range(world):
            p = ctx.Process(target=_ranked, args=(Inherit(), target, args(rank)),
                            name=f"phalanx-rank{rank}")
            p.start()
            procs.append(p)
    except OSError as e:  # out of processes or memory (fork/exec failed)
        stop(procs, None)
        raise PhalanxError(f"cannot start process {len(procs)} of {world}: "
                           f"{e.strerror or e}") from None
    except BaseException:
        stop(procs, None)
        raise
    return procs


def stop(procs: list, error_dir: str | None, grace_s: float = 3.0) -> None:
    """Stop every live process: SIGTERM to all at once, SIGKILL after ``grace_s``."""
    if error_dir is not None:
        try:
            Path(error_dir, STOPPING).touch()  # children print no traceback from now on
        except OSError:
            pass
    live = [p for p in procs if p.exitcode is None]
    deadline = time.monotonic() + grace_s
    while live:
        # again every moment: a rank still starting (not yet past ``_inherited``) has the
        # fork server's SIGTERM action, ignore (runtime/preloaded.py); a shard writing its
        # state only notes a repeated stop
        for p in live:
            p.terminate()
        left = deadline - time.monotonic()
        if left <= 0:
            break
        multiprocessing.connection.wait([p.sentinel for p in live], min(left, 0.2))
        live = [p for p in live if p.exitcode is None]
    for p in live:
        p.kill()
        p.join(1.0)
    for p in procs:
        p.join(1.0)  # reaped


def _formed(error_dir: str, world: int) -> bool:
    """Whether the process group formed: every rank (or its stand-in) got past the
    rendezvous (launch.py writes UP_FILE). One rank past it is not enough: gloo's full mesh
    returned on its side while a peer was still connecting to it, and its death then
    failed that peer's rendezvous ("Connection closed by peer"; a CI failure)."""
    return all(Path(error_dir, UP_FILE.format(rank=rank)).exists() for rank in range(world))


def _survived(rank: int, code: int, error_dir: str, world: int,
              survivable: Callable[[int], bool] | None,
              stand_in: Callable[[int], Any] | None, name: str) -> tuple[Any, Death | None]:
    """A process that ended with ``code``: (False, None) if that ends the run; else the
    :class:`Death` the run goes on without, beside True or a stand-in process (to watch in
    its place) if one took its place in the group's rendezvous."""
    if code >= 0 or survivable is None or not survivable(rank):
        return False, None
    if _formed(error_dir, world):
        said, how = "; the run goes on without it", exits.DIED
        proxy = True
    else:
        proxy = stand_in(rank) if stand_in is not None else None
        if proxy is None:
            return False, None  # its peers wait for it in the rendezvous: the run cannot go on
        said = (" before its process group formed; a stand-in took its place there and the "
                "run goes on without it")
        how = exits.STOOD_IN
    sys.stderr.write(f"phalanx: {name} {describe_exit(code)}{said}\n")
    sys.stderr.flush()
    return proxy, Death(rank=rank, name=name, exit_code=code, unix=time.time(), how=how)


def peer_lost(text: str) -> bool:
    """Whether an error says a peer's connection closed or reset under a collective
    (gloo: "Connection closed by peer [127.0.0.1]:9453", "Connection reset by peer"): the
    peer's end is the cause, and the driver names it, in one line."""
    return "closed by peer" in text or "reset by peer" in text


def _cause(fatal: list[tuple[int, int]], first: Any, error_dir: str, world: int,
           name: Callable[[int], str], note: Callable[[int], str] | None = None) -> str:
    """What ended the run, in one line, from the fatal ends and the first error recorded."""
    # a death by a signal came from outside (kill, OOM, segfault): it is the cause,
    # and its peers' errors ("connection reset by peer") are its consequences
    # (SIGABRT excepted: a C++ library aborts a process whose peer died first)
    killed = [(rank, code) for rank, code in fatal if code < 0 and -code != signal.SIGABRT]
    if killed:
        rank, code = killed[0]
        # its peers wait for it in the group's rendezvous: the run cannot go on
        return (f"{name(rank)} {describe_exit(code)}"
                + ("" if _formed(error_dir, world) else " before its process group formed")
                + (note(rank) if note is not None else ""))
    # likewise a process that exited without recording an error (an injected fault,
    # os._exit) caused the errors its peers recorded after it
    silent = [(rank, code) for rank, code in fatal
              if code > 0 and not Path(error_dir, ERROR_FILE.format(rank=rank)).exists()]
    if silent:
        return f"{name(silent[0][0])} {describe_exit(silent[0][1])}"
    if first is not None:
        return f"{name(first[0])} failed: {first[1]}"
    return f"{name(fatal[0][0])} {describe_exit(fatal[0][1])}"


def supervise(procs: list, error_dir: str, *, first_failure: Callable[[str], Any],
              fail: Callable[[str], BaseException],
              survivable: Callable[[int], bool] | None = None,
              name: Callable[[int], str] = default_name,
              stand_in: Callable[[int], Any] | None = None,
              note: Callable[[int], str] | None = None,
              saves_on_stop: Callable[[int], bool] | None = None,
              grace_s: float = 3.0,
              on_death: Callable[[Death], None] | None = None) -> list[Death]:
    """Wait for every process; raise ``fail(message)`` at the first fatal end. Returns the
    processes the run went on without (a survivable death, or one stopped after the run
    finished without it), each also handed to ``on_death`` as it is seen.
    ``stand_in(rank)``: a started process in a dead survivable rank's place in the
    rendezvous, or None (see the module). ``note(rank)``: said after a killed process that
    ends the run; ``saves_on_stop`` and ``grace_s``: see the module."""
    procs = list(procs)
    world = len(procs)
    waiting = dict(enumerate(procs))
    orphaned_since: float | None = None
    deaths: list[Death] = []

    def went_on_without(death: Death) -> None:
        deaths.append(death)
        if on_death is not None:
            on_death(death)
    try:
        while waiting:
            if survivable is not None and all(survivable(r) for r in waiting):
                # every process the run needs has finished well; what is left are workers
                # the servers already dropped (e.g. a stopped, hung process): end them
                orphaned_since = orphaned_since or time.monotonic()
                if time.monotonic() - orphaned_since > ORPHAN_GRACE_S:
                    for rank in waiting:
                        sys.stderr.write(f"phalanx: {name(rank)} was still running after the "
                                         "run finished without it; stopped\n")
                    stop([waiting[r] for r in waiting], error_dir)
                    for rank, p in waiting.items():  # (stop's last resort: SIGKILL)
                        code = -signal.SIGKILL if p.exitcode is None else p.exitcode
                        went_on_without(Death(rank=rank, name=name(rank), how=exits.STOPPED,
                                              exit_code=code, unix=time.time()))
                    return deaths
            multiprocessing.connection.wait([p.sentinel for p in waiting.values()], 1.0)
            ended = [(rank, p.exitcode) for rank, p in waiting.items()
                     if p.exitcode is not None]
            fatal = []
            for rank, code in ended:
                del waiting[rank]
                if code == 0:
                    continue
                survived, death = _survived(rank, code, error_dir, world, survivable,
                                            stand_in, name(rank))
                if death is not None:
                    went_on_without(death)
                if survived is not True and survived is not False:  # a stand-in: watch it
                    waiting[rank] = procs[rank] = survived
                if survived is False:
                    fatal.append((rank, code))
            if fatal:
                first = first_failure(error_dir)
                if first is not None and peer_lost(first[1]) and waiting:
                    # the peer it lost may be ending still (a rank killed while the others
                    # join: its peer's error came first): its end, not the error, is the
                    # cause (_cause prefers a death by a signal)
                    multiprocessing.connection.wait(
                        [p.sentinel for p in waiting.values()], PEER_GRACE_S)
                    fatal += [(rank, p.exitcode) for rank, p in waiting.items()
                              if p.exitcode is not None and p.exitcode < 0]
                stop(procs, error_dir, grace_s)
                raise fail(_cause(fatal, first, error_dir, world, name, note))
        return deaths
    except BaseException as e:
        stop(procs, error_dir, grace_s)  # an interrupt of the driver, or the failure above
        if isinstance(e, KeyboardInterrupt) and saves_on_stop is not None:
            keepers = [p for rank, p in enumerate(procs) if saves_on_stop(rank)]
            e.saved = bool(keepers) and all(p.exitcode == PREEMPTED_EXIT for p in keepers)
        raise
