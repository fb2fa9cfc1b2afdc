"""Follow a growing log file: the complete lines it gained since the last read (the watchers of a running job).

    tail = LogTail(path).from_end()     # start at what is there now
    lines = tail.new_lines()            # [] when nothing new (or the file cannot be read); a truncated file restarts
"""

from __future__ import annotations

from pathlib import Path


class LogTail:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.offset = 0
        self._partial = ""

    def from_end(self) -> LogTail:
        """Skip what the file holds now; returns self."""
        try:
            self.offset = self.path.stat().st_size
        except OSError:
            self.offset = 0
        self._partial = ""
        return self

    def new_lines(self) -> list[str]:
        """The complete lines written since the last call (a line still being written waits for its newline)."""
        try:
            size = self.path.stat().st_size
            if size < self.offset:  # truncated or replaced
                self.offset, self._partial = 0, ""
            if size == self.offset:
                return []
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read(size - self.offset)
            self.offset = size
        except OSError:
            return []
        lines = (self._partial + chunk.decode("utf-8", errors="replace")).split("\n")
        self._partial = lines.pop()
        return lines
