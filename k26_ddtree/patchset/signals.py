"""SIGINT and SIGTERM for one patch-set command: raised at once while nothing is being changed,
held back while the tree is, so a rollback is never cut short.

Python runs a signal handler between any two bytecodes; a KeyboardInterrupt raised there can
land between an os.replace and the bookkeeping that would undo it. Once a command holds the
site lock, a signal is only recorded, and the transaction asks for it at checkpoints placed
where stopping is safe (before each step); it then rolls back with signals still held and
exits 128 + the signal number.
"""

from __future__ import annotations

import signal
import threading

HANDLED = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """A signal taken at a checkpoint (or at once, before the lock is held)."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(self.name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class Signals:
    def __init__(self) -> None:
        self.pending: int | None = None
        self._holding = False
        self._saved: dict[int, object] = {}

    def __enter__(self) -> "Signals":
        # Only the main thread may install handlers; a command run from another thread (a
        # library caller) keeps whatever signal handling that program has.
        if threading.current_thread() is threading.main_thread():
            for signum in HANDLED:
                self._saved[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame) -> None:
        if not self._holding:
            raise Interrupted(signum)
        if self.pending is None:
            self.pending = signum

    def hold(self) -> None:
        """From now on a signal waits for the next checkpoint."""
        self._holding = True

    def checkpoint(self) -> None:
        if self.pending is not None:
            raise Interrupted(self.pending)
