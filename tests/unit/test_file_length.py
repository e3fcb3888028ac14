"""One concern per file (docs/architecture.md, issue 48): no module of the scheduler's house
(``phalanx/cluster/``) is over 400 lines; a file that grows past it is split by
responsibility, not cut at a line."""

from __future__ import annotations

from pathlib import Path

import phalanx

CLUSTER = Path(phalanx.__file__).parent / "cluster"
MAX_LINES = 400


def long_files(root: Path, limit: int = MAX_LINES) -> dict[str, int]:
    """Each ``.py`` file under ``root`` longer than ``limit`` lines, with its length."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > limit:
            out[str(path.relative_to(root))] = n
    return out


def test_no_cluster_file_is_over_400_lines() -> None:
    assert long_files(CLUSTER) == {}


def test_the_length_check_sees_a_long_file(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n" * MAX_LINES)
    assert long_files(tmp_path) == {"pkg/long.py": MAX_LINES + 1}
