"""One rule for every path a request names: it is relative to the dashboard's folder and
stays inside it. Absolute paths, ``..`` parts and links that lead out are refused."""

from __future__ import annotations

from pathlib import Path, PurePosixPath


class Refused(ValueError):
    """A path that names something outside the folder (the message says why)."""


def inside(root: Path, rel: str) -> Path:
    """``root / rel`` resolved, or :class:`Refused`. ``root`` must already be resolved."""
    if not rel or rel == ".":
        return root
    if "\x00" in rel or "\\" in rel:
        raise Refused("a path with a NUL or a backslash is refused")
    pure = PurePosixPath(rel)
    if pure.is_absolute() or rel.startswith("~"):
        raise Refused("absolute paths are refused: name a path inside the folder")
    if any(part == ".." for part in pure.parts):
        raise Refused("'..' is refused: the dashboard serves nothing outside its folder")
    target = (root / pure).resolve()
    if target != root and root not in target.parents:
        raise Refused("that path leads outside the folder (a link?)")
    return target


def rel_id(root: Path, path: Path) -> str:
    """The id a page uses for ``path``: its POSIX path relative to ``root`` ('.' for it)."""
    return path.relative_to(root).as_posix() or "."
