"""Small tmpfs mounts for the disk-full fault: each a job's run folder, mounted before the
schedule starts and unmounted after it, their files kept (copied to the disk underneath)
so that the invariants read them as any other job's."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from phalanx.cluster.chaos.faults import TMPFS_SIZE


def can_mount() -> bool:
    """Root, with ``mount`` and ``umount`` (the disk-full fault needs them)."""
    return os.geteuid() == 0 and bool(shutil.which("mount")) and bool(shutil.which("umount"))


class Tmpfs:
    """``with Tmpfs(folders) as t: ...; problems = t.release()``: each folder a tmpfs of
    :data:`TMPFS_SIZE` meanwhile; ``release`` unmounts them (a busy one lazily: a process
    still had a file open there, which it reports)."""

    def __init__(self, folders: list[Path]) -> None:
        self.folders, self.mounted = folders, []

    def __enter__(self) -> Tmpfs:
        for folder in self.folders:
            folder.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}",
                            "phalanx-chaos", str(folder)], check=True, capture_output=True)
            self.mounted.append(folder)
        return self

    def release(self) -> list[str]:
        problems = []
        for folder in self.mounted:
            keep = Path(tempfile.mkdtemp(prefix="chaos-keep-", dir=folder.parent.parent))
            shutil.copytree(folder, keep, dirs_exist_ok=True, symlinks=True)
            r = subprocess.run(["umount", str(folder)], capture_output=True, text=True,
                               check=False)
            if r.returncode != 0:
                problems.append(f"{folder}: busy at the end ({r.stderr.strip()}): unmounted "
                                "lazily")
                subprocess.run(["umount", "-l", str(folder)], capture_output=True, check=False)
            shutil.copytree(keep, folder, dirs_exist_ok=True, symlinks=True)
            shutil.rmtree(keep, ignore_errors=True)
        self.mounted = []
        return problems

    def __exit__(self, *exc: object) -> None:
        self.release()
