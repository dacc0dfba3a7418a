"""A plain-text progress bar on a stream (stderr): redrawn in place on a terminal,
one line per tenth of the work otherwise (logs stay short)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, label: str, total: int, stream: TextIO | None = None, width: int = 30) -> None:
        self.label = label
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.done = 0
        self.start = time.perf_counter()
        self._interactive = self.stream.isatty()
        self._last_tenth = -1

    def advance(self, note: str = "") -> None:
        self.done += 1
        tenth = self.done * 10 // max(self.total, 1)
        if self._interactive:
            self.stream.write("\r" + self._line(note) + "\x1b[K")
            if self.done == self.total:
                self.stream.write("\n")
        elif tenth != self._last_tenth:
            self.stream.write(self._line(note) + "\n")
        self._last_tenth = tenth
        self.stream.flush()

    def _line(self, note: str) -> str:
        filled = self.done * self.width // max(self.total, 1)
        bar = "#" * filled + "." * (self.width - filled)
        seconds = time.perf_counter() - self.start
        return f"{self.label} [{bar}] {self.done}/{self.total} {seconds:5.1f}s {note}".rstrip()
