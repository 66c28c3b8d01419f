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

Out = Callable[[str], None]


@contextmanager
def session(site: Path, command: str, lock_timeout: float, out: Out, recover: Callable[[], bool]) -> Iterator[Signals]:
    """Run a writing command's block under the exclusive lock on `site`: signals are held for
    checkpoints from the moment the lock is taken, and `recover` runs first."""
    recovered = False
    with Signals() as signals:
        try:
            with lock.held(site, command, lock_timeout, out):
                signals.hold()
                recovered = recover()
                yield signals
        except Interrupted as sig:
            beyond = " beyond the recovery above" if recovered else ""
            raise UserError(f"interrupted by {sig.name}; {command} changed nothing{beyond}", code=sig.exit_code) from None
        if signals.pending is not None:
            name = signal.Signals(signals.pending).name
            raise UserError(f"{name} arrived as {command} finished; its result above stands", code=128 + signals.pending)


def reading(site: Path, command: str, lock_timeout: float, out: Out, body: Callable[[Out], int]) -> int:
    """Run a read-only command (`body`, printing through the function it is given), creating
    nothing, and never on a tree a writer is changing; a signal stops it at once.

    With the lock file there, `body` runs under the shared lock. Without it, `body` runs
    unlocked and its output is held back: a writer creates the lock file before it changes
    anything and the file is never deleted, so if it is still absent afterwards no writer
    changed anything during the read, and the output is printed; if one has appeared, the read
    may be torn, so it is thrown away and `body` runs again under the lock."""
    with Signals():
        try:
            while True:
                held_back: list[str] = []
                with lock.shared(site, lock_timeout, out) as locked:
                    if locked:
                        return body(out)
                    try:
                        result, error = body(held_back.append), None
                    except (UserError, OSError) as err:
                        # A refusal or a failed read stands only if no writer was at work: a
                        # torn read may cause either.
                        result, error = None, err
                if not lock.exists(site):
                    for line in held_back:
                        out(line)
                    if error is not None:
                        raise error
                    return result
        except Interrupted as sig:
            raise UserError(f"interrupted by {sig.name}; {command} changed nothing", code=sig.exit_code) from None
