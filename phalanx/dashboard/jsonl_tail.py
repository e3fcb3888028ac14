"""Reads an append-only JSONL file (``events.jsonl``) incrementally: each call reads only
what was appended since the last one. A last line without its newline is a line still
being written (kept for the next read); a complete line that is not a JSON object is
counted as bad and named, never raised."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_READ = 64 << 20  # one call reads at most this much (a huge log is read over several)


@dataclass
class JsonlTail:
    path: Path
    offset: int = 0
    lines: int = 0
    partial: bytes = b""
    bad: list[int] = field(default_factory=list)   # line numbers (1-based) that were not JSON
    inode: int = -1

    def read_new(self) -> list[dict[str, Any]]:
        """The objects appended since the last call ([] if nothing new or no file)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return []
        if st.st_ino != self.inode or st.st_size < self.offset:  # replaced or truncated
            self.offset, self.lines, self.partial, self.bad = 0, 0, b"", []
            self.inode = st.st_ino
        if st.st_size == self.offset:
            return []
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read(min(st.st_size - self.offset, MAX_READ))
        except OSError:
            return []
        self.offset += len(chunk)
        data = self.partial + chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            self.partial = data
            return []
        self.partial = data[cut + 1:]
        out = []
        for raw in data[:cut].split(b"\n"):
            self.lines += 1
            try:
                obj = json.loads(raw, parse_constant=lambda name: None)
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                out.append(obj)
            elif raw.strip():
                self.bad.append(self.lines)
        return out

    @property
    def unfinished_line(self) -> bool:
        """The file ends inside a line (a writer mid-line, or a truncated file)."""
        return bool(self.partial.strip())
