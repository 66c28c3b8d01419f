"""When a closed loop issues its next request: the issuing policy of `bench --steady`.

A repeat keeps `concurrency` requests in flight over `cycle` prompts taken in order from
`first`. It stops issuing at the first end of a whole cycle once `min_seconds` have passed
and at least max(cycle, concurrency) requests went out: every prompt weighs the same in
every repeat, and the batch was full at least once. Not thread-safe: callers that take from
several threads hold their own lock around `take`.
"""

from __future__ import annotations


class ClosedLoop:
    def __init__(self, cycle: int, concurrency: int, min_seconds: float, start: float, first: int = 0):
        if cycle < 1 or concurrency < 1:
            raise ValueError("a closed loop needs at least one prompt and one request in flight")
        self.cycle = cycle
        self.concurrency = concurrency
        self.min_seconds = min_seconds
        self.start = start
        self.first = first
        self.issued = 0

    def take(self, now: float) -> int | None:
        """The index of the prompt to send next, or None once the repeat issues no more."""
        whole_cycles = self.issued % self.cycle == 0 and self.issued >= max(self.cycle, self.concurrency)
        if whole_cycles and now - self.start >= self.min_seconds:
            return None
        index = (self.first + self.issued) % self.cycle
        self.issued += 1
        return index
