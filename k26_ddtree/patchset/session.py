"""The frame of every patch-set command: signals handled, the site lock held, what a killed
command left recovered, and every way out turned into one true line and its exit code."""

from __future__ import annotations

import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from k26_ddtree.errors import UserError
from k26_ddtree.patchset import lock
from k26_ddtree.patchset.signals import Interrupted, Signals


@contextmanager
def session(site: Path, command: str, lock_timeout: float, out: Callable[[str], None],
            recover: Callable[[], bool] | None = None) -> Iterator[Signals]:
    """Run the block under the lock on `site`. With `recover` (a writing command) signals are held
    for checkpoints from the moment the lock is taken and `recover` runs first; without it the
    command only reads, and a signal stops it at once."""
    recovered = False
    with Signals() as signals:
        try:
            with lock.held(site, command, lock_timeout, out, read_only=recover is None):
                if recover is not None:
                    signals.hold()
                    recovered = recover()
                yield signals
        except Interrupted as sig:
            beyond = " beyond the recovery above" if recovered else ""
            raise UserError(f"interrupted by {sig.name}; {command} changed nothing{beyond}", code=sig.exit_code) from None
        if signals.pending is not None:
            name = signal.Signals(signals.pending).name
            raise UserError(f"{name} arrived as {command} finished; its result above stands", code=128 + signals.pending)
