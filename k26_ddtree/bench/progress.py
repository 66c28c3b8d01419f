"""A one-line progress display on stderr (no tqdm dependency).

On a terminal the line is redrawn in place; in a log (not a tty) one line is
printed per finished cell so journals stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

REDRAW_EVERY_S = 0.1


class Progress:
    def __init__(self, total_cells: int, stream: TextIO | None = None, quiet: bool = False):
        self.total_cells = total_cells
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.cell_index = 0
        self.label = ""
        self.planned = 0
        self.done = 0
        self.errors = 0
        self.cell_started = 0.0
        self._drawn_at = 0.0

    def start_cell(self, label: str, planned: int) -> None:
        self.cell_index += 1
        self.label, self.planned, self.done, self.errors = label, planned, 0, 0
        self.cell_started = time.monotonic()
        self._draw(force=True)

    def request_done(self, ok: bool) -> None:
        self.done += 1
        self.errors += 0 if ok else 1
        self._draw(force=self.done == self.planned)

    def end_cell(self, summary: str) -> None:
        if self.quiet:
            return
        prefix = "\r\033[K" if self.tty else ""
        self.stream.write(f"{prefix}[{self.cell_index}/{self.total_cells}] {self.label}: {summary}\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        if not self.quiet:
            prefix = "\r\033[K" if self.tty else ""
            self.stream.write(f"{prefix}{text}\n")
            self.stream.flush()

    def _draw(self, force: bool) -> None:
        if self.quiet or not self.tty:
            return
        now = time.monotonic()
        if not force and now - self._drawn_at < REDRAW_EVERY_S:
            return
        self._drawn_at = now
        width = 24
        filled = int(width * self.done / self.planned) if self.planned else width
        bar = "#" * filled + "." * (width - filled)
        errors = f" errors {self.errors}" if self.errors else ""
        self.stream.write(
            f"\r\033[K[{self.cell_index}/{self.total_cells}] {self.label} [{bar}] "
            f"{self.done}/{self.planned}{errors} {now - self.cell_started:.1f}s"
        )
        self.stream.flush()
