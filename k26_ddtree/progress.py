"""Progress of long work, one display for the toolkit: downloads, hashing, benchmark cells.

On a terminal each meter is a tqdm bar (the bars pip, sglang and huggingface_hub draw), and
permanent lines are written above the bars. In a log or a pipe nothing is redrawn: a meter
prints a plain line every `interval_s` seconds, so journals get no carriage-return spam.
Counting is thread-safe (`TotalMeter.add` from hashing threads); drawing happens only in the
thread that calls `Reporter.tick`, never in the workers.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Callable, Iterator, TextIO

from tqdm import tqdm


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
    """Work done out of a total, in bytes (`unit="B"`) or counted things (`unit="req"`). The rate
    is measured over the last `window_s` seconds so it follows the current speed rather than
    the run's average. `extra` (e.g. "errors 2") is shown beside the numbers."""

    def __init__(self, label: str, total: int, already_done: int = 0, window_s: float = 10.0,
                 unit: str = "B"):
        self.label = label
        self.total = total
        self.unit = unit
        self.extra = ""
        self.done = self.already_done = min(already_done, total)
        self._window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()
        self._start = time.monotonic()
        self._lock = threading.Lock()

    def set_done(self, done: int) -> None:
        with self._lock:
            self._set(done)

    def add(self, n: int) -> None:
        """Count `n` more; safe from several threads at once."""
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

    def _amount(self, n: float) -> str:
        return human_bytes(n) if self.unit == "B" else f"{n:.0f} {self.unit}"

    def line(self) -> str:
        pct = 100.0 * self.done / self.total if self.total else 100.0
        rate = self.rate()
        eta = human_duration((self.total - self.done) / rate) if rate > 0 else "?"
        rate_text = f"{human_bytes(rate)}/s" if self.unit == "B" else f"{rate:.1f} {self.unit}/s"
        extra = f"  {self.extra}" if self.extra else ""
        return (f"{self.label} {self._amount(self.done)} / {self._amount(self.total)} ({pct:.0f}%)  "
                f"{rate_text}  ETA {eta}{extra}")

    def summary(self) -> str:
        """This run's work and average rate; what an earlier run already did is named apart."""
        elapsed = time.monotonic() - self._start
        now_done = max(self.done - self.already_done, 0)
        rate = now_done / elapsed if elapsed > 0 else 0.0
        rate_text = f"{human_bytes(rate)}/s" if self.unit == "B" else f"{rate:.1f} {self.unit}/s"
        earlier = f" (+ {self._amount(self.already_done)} from an earlier run)" if self.already_done else ""
        return f"{self.label} {self._amount(now_done)} in {human_duration(elapsed)} ({rate_text} average){earlier}"


class Reporter:
    """Where progress goes. Permanent lines always print (unless `quiet`); meters are tqdm bars
    on a terminal and a line every `interval_s` seconds (default 15) in logs and pipes."""

    def __init__(self, stream: TextIO | None = None, interval_s: float = 15.0, quiet: bool = False):
        self.stream = stream or sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval_s = interval_s
        self.quiet = quiet
        self._last_tick = time.monotonic()
        self._bars: dict[TotalMeter, tqdm] = {}

    def line(self, text: str) -> None:
        if self.quiet:
            return
        if self._bars:
            tqdm.write(text, file=self.stream)  # above the bars, which are redrawn below it
        else:
            print(text, file=self.stream, flush=True)

    def tick(self, meter: TotalMeter, force: bool = False) -> None:
        if self.quiet:
            return
        if self.tty:
            self._draw(meter, force)
            return
        now = time.monotonic()
        if force or now - self._last_tick >= self.interval_s:
            self._last_tick = now
            print(meter.line(), file=self.stream, flush=True)

    def finish(self, meter: TotalMeter, text: str | None = None) -> None:
        """The meter is done: its bar goes away and `text`, by default its summary, stays."""
        bar = self._bars.pop(meter, None)
        if bar is not None:
            self._update(bar, meter)
            bar.close()
        self.line(meter.summary() if text is None else text)

    def _draw(self, meter: TotalMeter, force: bool) -> None:
        bar = self._bars.get(meter)
        if bar is None:
            in_bytes = meter.unit == "B"
            bar = tqdm(total=meter.total, initial=meter.done, desc=meter.label, unit=meter.unit,
                       unit_scale=in_bytes, unit_divisor=1024 if in_bytes else 1000, file=self.stream,
                       leave=False, dynamic_ncols=True)
            self._bars[meter] = bar
        self._update(bar, meter)
        if force:
            bar.refresh()

    @staticmethod
    def _update(bar: tqdm, meter: TotalMeter) -> None:
        if meter.extra:
            bar.set_postfix_str(meter.extra, refresh=False)
        bar.update(meter.done - bar.n)


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
