"""Output folders: where a command may write, checked before anything is written.

* :func:`check_out` — ``--out`` must be (or become) a writable directory: not an existing
  regular file, not under a file, not in ``/proc``, ``/sys`` or ``/dev``. One line, exit 2.
* :func:`prepare_run_dir` — a training run never mixes with an earlier one: a non-empty
  run folder is refused unless ``--overwrite`` (which clears what an earlier run wrote, and
  refuses to delete anything else) or ``--resume`` (which continues the run in it).
* :func:`inside` — whether a path stays inside a folder (job lists use it).
"""

from __future__ import annotations

import fcntl
import fnmatch
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any

from phalanx.errors import ConfigError
from phalanx.parallel.registry import spec

SYSTEM_ROOTS = (Path("/proc"), Path("/sys"), Path("/dev"))
# what a training run writes in its folder (names or fnmatch patterns); --overwrite removes
# these and nothing else
RUN_OUTPUTS = ("config.json", "events.jsonl", "summary.json", "*.pt", "*.ckpt", ".*.tmp*",
               "*.tmp", "tensorboard")
NAME_MAX = 255  # bytes in one file name (Linux, macOS)
LOCK = ".phalanx.lock"  # held (flock) by the process that runs in the folder


def inside(path: str | Path, folder: str | Path) -> bool:
    """True when ``path`` (resolved, links followed) lies in ``folder`` or is it."""
    try:
        p, f = Path(path).resolve(), Path(folder).resolve()
    except (OSError, RuntimeError):
        return False
    return p == f or f in p.parents


def check_out(path: str | Path, flag: str = "--out") -> Path:
    """Create ``path`` as a directory if needed and make sure this process can write in it;
    one-line ``ConfigError`` naming ``flag`` otherwise."""
    text = str(path)
    if not text or "\x00" in text:
        raise ConfigError(f"{flag}: {text!r} is not a directory path")
    p = Path(text)
    long = next((part for part in p.parts if len(os.fsencode(part)) > NAME_MAX), None)
    if long is not None:
        raise ConfigError(f"{flag}: a path component of {len(os.fsencode(long))} bytes is "
                          f"longer than the {NAME_MAX} a file name may have")
    try:
        resolved = p.resolve()
    except (OSError, RuntimeError) as e:
        raise ConfigError(f"{flag} {text}: cannot resolve ({e})") from None
    for root in SYSTEM_ROOTS:
        if resolved == root or root in resolved.parents:
            raise ConfigError(f"{flag} {text}: is inside {root}, a system folder, not an "
                              "output folder")
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{flag} {text}: exists and is not a directory")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{flag} {text}: {parent} is a file, not a directory")
            break
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".phalanx-write-test-", dir=p)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"{flag} {text}: cannot write there ({e.strerror or e})") from None
    return p


def _is_run_output(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in RUN_OUTPUTS)


def prepare_run_dir(out: str | Path, *, overwrite: bool, resume: bool) -> Path:
    """The run folder, checked and ready: empty, cleared (``overwrite``) or resumed."""
    p = check_out(out)
    if resume:
        return p
    entries = sorted(e.name for e in p.iterdir() if e.name != LOCK)
    if not entries:
        return p
    if not overwrite:
        shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
        resumable = "checkpoint.pt" in entries or any(e.endswith(".ckpt") for e in entries)
        then = (f"or use --resume {out} to continue it" if resumable
                else "it holds no checkpoint to resume")
        raise ConfigError(f"--out {out}: not empty ({shown}); add --overwrite to replace "
                          f"that run ({then})")
    foreign = [e for e in entries if not _is_run_output(e)]
    if foreign:
        shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
        raise ConfigError(f"--out {out} --overwrite: holds files a run does not write "
                          f"({shown}); not deleting them: move them or choose another folder")
    for name in entries:
        target = p / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()
    return p


def check_resume_out(cfg: Any) -> None:
    """``--resume DIR`` writes into DIR: a different ``--out`` is a contradiction, refused
    (it used to be ignored silently, which let a job list write into another run)."""
    if cfg.overwrite:
        raise ConfigError(f"--overwrite and --resume {cfg.resume}: a resumed run continues "
                          "in its folder, nothing is cleared; drop --overwrite")
    default = type(cfg).__dataclass_fields__["out"].default
    if cfg.out != default and not (inside(cfg.out, cfg.resume) and inside(cfg.resume, cfg.out)):
        raise ConfigError(f"--out {cfg.out} and --resume {cfg.resume}: a resumed run writes "
                          "into its own folder; drop --out")


def hold_run_dir(out: str | Path) -> IO[bytes]:
    """Lock the run folder for this process (close the returned file to release it; the
    kernel releases it if the process dies). A second run into the same folder at the same
    time is refused in one line instead of mixing its files with the first one's."""
    p = check_out(out)
    f = open(p / LOCK, "ab")  # noqa: SIM115 - held open for the whole run
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise ConfigError(f"--out {out}: another phalanx run is writing in this folder "
                          "right now") from None
    return f


def resume_hint(cfg: Any) -> str:
    """What to tell a user whose run was interrupted (empty when nothing can resume it)."""
    if not cfg.checkpoint_every:
        return ""
    try:
        can_resume = spec(cfg.strategy).can_resume
    except ConfigError:
        return ""
    folder = cfg.resume or cfg.out
    return f"; continue from its last checkpoint: phalanx train --resume {folder}" \
        if can_resume else ""
