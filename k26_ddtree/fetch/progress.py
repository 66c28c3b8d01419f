"""Human sizes, and a running total with rate and ETA for long transfers and hashing."""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Callable, Iterator, TextIO


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class TotalMeter:
    """Bytes done out of a total; the rate is measured over the last `window_s` seconds so it
    follows the link's current speed rather than the run's average."""

    def __init__(self, label: str, total: int, already_done: int = 0, window_s: float = 10.0):
        self.label = label
        self.total = total
        self.done = self._already_done = min(already_done, total)
        self._window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()
        self._start = time.monotonic()
        self._lock = threading.Lock()

    def set_done(self, done: int) -> None:
        with self._lock:
            self._set(done)

    def add(self, n: int) -> None:
        """Count `n` more bytes; safe from several hashing threads at once."""
        with self._lock:
            self._set(self.done + n)

    def _set(self, done: int) -> None:
        self.done = min(done, self.total)
        now = time.monotonic()
        self._samples.append((now, self.done))
        while len(self._samples) > 2 and now - self._samples[0][0] > self._window_s:
            self._samples.popleft()

    def rate(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return max(b1 - b0, 0) / (t1 - t0) if t1 > t0 else 0.0

    def line(self) -> str:
        pct = 100.0 * self.done / self.total if self.total else 100.0
        rate = self.rate()
        eta = human_duration((self.total - self.done) / rate) if rate > 0 else "?"
        return (f"{self.label} {human_bytes(self.done)} / {human_bytes(self.total)} ({pct:.0f}%)  "
                f"{human_bytes(rate)}/s  ETA {eta}")

    def summary(self) -> str:
        """This run's work and average rate; bytes an earlier run already did are named apart."""
        elapsed = time.monotonic() - self._start
        now_done = max(self.done - self._already_done, 0)
        rate = now_done / elapsed if elapsed > 0 else 0.0
        earlier = f" (+ {human_bytes(self._already_done)} from an earlier run)" if self._already_done else ""
        return (f"{self.label} {human_bytes(now_done)} in {human_duration(elapsed)} "
                f"({human_bytes(rate)}/s average){earlier}")


class Reporter:
    """Where progress goes. Per-file lines always print; the running total rewrites one line on
    a terminal and prints a line every `interval_s` seconds into logs and pipes."""

    def __init__(self, stream: TextIO | None = None, interval_s: float | None = None):
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.interval_s = interval_s if interval_s is not None else (1.0 if self.tty else 15.0)
        self._last_tick = time.monotonic()
        self._pending_cr = False

    def line(self, text: str) -> None:
        self._clear()
        print(text, file=self.stream, flush=True)

    def tick(self, meter: TotalMeter, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_tick < self.interval_s:
            return
        self._last_tick = now
        if self.tty:
            self.stream.write("\r\033[K" + meter.line())
            self.stream.flush()
            self._pending_cr = True
        else:
            print(meter.line(), file=self.stream, flush=True)

    def _clear(self) -> None:
        if self._pending_cr:
            self.stream.write("\r\033[K")
            self._pending_cr = False


def as_they_finish(futures: list[Future], tick: Callable[[], None],
                   poll_s: float = 0.1) -> Iterator[Future]:
    """Yield futures as they complete, calling `tick()` while waiting (progress from the
    thread that owns the output, never from the workers)."""
    pending = list(futures)
    while pending:
        done = [f for f in pending if f.done()]
        for future in done:
            pending.remove(future)
            yield future
        if pending and not done:
            tick()
            time.sleep(poll_s)
