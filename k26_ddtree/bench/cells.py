"""The numbered cells of one bench run (matrix cells, then eval endpoints) on the shared
progress display: a bar of requests (or steady repeats) per cell on a terminal, one summary
line per cell, and one line per steady repeat."""

from __future__ import annotations

from k26_ddtree.progress import Reporter, TotalMeter


class CellProgress:
    def __init__(self, total_cells: int, reporter: Reporter):
        self.total_cells = total_cells
        self.reporter = reporter
        self._index = 0
        self._errors = 0
        self._meter: TotalMeter | None = None

    def start_cell(self, label: str, planned: int, unit: str = "req") -> None:
        self._index += 1
        self._errors = 0
        self._meter = TotalMeter(f"[{self._index}/{self.total_cells}] {label}", planned, unit=unit)
        self.reporter.tick(self._meter)

    def request_done(self, ok: bool) -> None:
        self._meter.add(1)
        if not ok:
            self._errors += 1
            self._meter.extra = f"errors {self._errors}"
        self.reporter.tick(self._meter)

    def repeat_done(self, summary: str) -> None:
        self._meter.add(1)
        self.reporter.line(f"{self._meter.label} {summary}")
        self.reporter.tick(self._meter)

    def end_cell(self, summary: str) -> None:
        self.reporter.finish(self._meter, f"{self._meter.label}: {summary}")
