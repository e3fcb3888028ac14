"""One small registry for everything a user picks by name: update rules, data sets,
models, compressors (issue #26). Adding one is its module (or class) plus one ``add`` line;
the CLI's choices and help come from the catalog, and an unknown name is a one-line error
naming the flag, never a fallback value."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from phalanx.errors import ConfigError
from phalanx.limits import short

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    item: T
    help: str = ""


class Catalog(Generic[T]):
    """Names -> items of one kind, in the order they were added. ``flag``: the setting
    that picks one (its error messages name it)."""

    def __init__(self, kind: str, flag: str) -> None:
        self.kind, self.flag = kind, flag
        self._entries: dict[str, Entry[T]] = {}

    def add(self, name: str, item: T, help: str = "") -> T:
        if not name or name in self._entries:
            raise ValueError(f"{self.kind}: {name!r} is empty or added twice")
        self._entries[name] = Entry(name, item, help)
        return item

    def get(self, name: str) -> T:
        entry = self._entries.get(name) if isinstance(name, str) else None
        if entry is None:
            raise ConfigError(f"{self.flag}: {short(name)} is not one of {', '.join(self)}")
        return entry.item

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def help(self, name: str) -> str:
        return self._entries[name].help

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
