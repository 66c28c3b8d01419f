"""Running the real `aria2c` over a list of downloads, and hearing which ones finished.

The token travels only inside aria2c's input, as a per-URI `header=` option, and that input
is fed through a pipe (`--input-file=-`): it never appears in argv (visible in `ps` to every
user), in the environment aria2c inherits, or in a file that a killed run could leave behind.

Completion comes from aria2c's own hooks (`--on-download-complete` / `--on-download-error`),
which append one line per finished download to an events file; that is exact where parsing
aria2c's console output is not. A download that ends in the same instant as aria2c itself may
miss its hook line, so the caller also checks the files once aria2c has exited.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from k26_ddtree.errors import UserError
from k26_ddtree.fetch.token import TOKEN_ENV_VARS

EVENTS_NAME = ".aria2-events"
CONTROL_SUFFIX = ".aria2"  # aria2c's resume record next to each unfinished file


@dataclass(frozen=True)
class Aria2Job:
    url: str
    target: Path  # absolute path of the file aria2c writes (inside the .partial directory)


@dataclass(frozen=True)
class Aria2Settings:
    connections: int = 16       # per file: -x (aria2c allows at most 16) and -s
    parallel_files: int = 6     # -j
    min_split_size: str = "20M"  # a file is split into connections only in pieces of at least this
    max_tries: int = 5
    retry_wait_s: int = 3


def find_aria2c() -> str:
    path = shutil.which("aria2c")
    if not path:
        raise UserError("aria2c is not installed: run `apt-get install -y aria2` "
                        "(or `k26-deploy setup`, which installs it)")
    return path


def control_file(target: Path) -> Path:
    return target.with_name(target.name + CONTROL_SUFFIX)


def input_text(jobs: list[Aria2Job], token: str | None) -> str:
    """aria2c's input-file format: a URI line, then indented per-URI options."""
    lines = []
    for job in jobs:
        lines.append(job.url)
        lines.append(f"  dir={job.target.parent}")
        lines.append(f"  out={job.target.name}")
        if token:
            lines.append(f"  header=Authorization: Bearer {token}")
    return "\n".join(lines) + "\n"


def aria2c_argv(binary: str, settings: Aria2Settings, hooks: dict[str, Path]) -> list[str]:
    """The command line; it holds nothing secret (tests assert that on the live process)."""
    return [
        binary,
        "--no-conf",  # a user's ~/.aria2/aria2.conf must not change what we run
        "--input-file=-",
        "--continue=true",
        "--always-resume=true",
        "--auto-file-renaming=false",
        "--allow-overwrite=false",
        "--file-allocation=none",  # no preallocation: allocated blocks then track bytes received
        "--auto-save-interval=1",  # resume record at most a second old if aria2c is killed
        f"--max-connection-per-server={settings.connections}",
        f"--split={settings.connections}",
        f"--min-split-size={settings.min_split_size}",
        f"--max-concurrent-downloads={settings.parallel_files}",
        f"--max-tries={settings.max_tries}",
        f"--retry-wait={settings.retry_wait_s}",
        "--connect-timeout=30",
        "--timeout=60",
        f"--on-download-complete={hooks['complete']}",
        f"--on-download-error={hooks['error']}",
        f"--stop-with-process={os.getpid()}",  # never outlive a killed k26-deploy
        "--summary-interval=0",
        "--show-console-readout=false",
        "--console-log-level=warn",
        "--download-result=hide",
        "--enable-color=false",
    ]


class Aria2Process:
    """One aria2c run over `jobs`. Use as a context manager: leaving it stops aria2c."""

    def __init__(self, jobs: list[Aria2Job], token: str | None, settings: Aria2Settings,
                 work_dir: Path):
        work_dir.mkdir(parents=True, exist_ok=True)
        self._events_path = work_dir / EVENTS_NAME
        self._events_path.write_bytes(b"")
        self._events_offset = 0
        hooks = {kind: self._write_hook(work_dir, kind) for kind in ("complete", "error")}
        env = {k: v for k, v in os.environ.items() if k not in TOKEN_ENV_VARS}
        self.output_tail: deque[str] = deque(maxlen=40)
        self._proc = subprocess.Popen(
            aria2c_argv(find_aria2c(), settings, hooks), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=work_dir,
            # Its own session: Ctrl-C reaches only k26-deploy, which then stops aria2c with one
            # SIGTERM (a second signal would make aria2c halt without finishing cleanly).
            start_new_session=True)
        text = input_text(jobs, token).encode()
        # A pipe holds 64 KiB; a long list would block until aria2c reads it, hence a thread.
        self._writer = threading.Thread(target=self._feed, args=(text,), daemon=True)
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._writer.start()
        self._reader.start()

    def _write_hook(self, work_dir: Path, kind: str) -> Path:
        hook = work_dir / f".aria2-on-{kind}"
        # aria2c runs the hook with: GID, number of files, path of the first file.
        hook.write_text(f"#!/bin/sh\nprintf '{kind}\\t%s\\n' \"$3\" >> "
                        f"{shlex.quote(str(self._events_path))}\n")
        hook.chmod(0o700)
        return hook

    def _feed(self, text: bytes) -> None:
        try:
            self._proc.stdin.write(text)
            self._proc.stdin.close()
        except OSError:
            pass  # aria2c exited early; its exit status and output say why

    def _drain(self) -> None:
        for raw in self._proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            if line:
                self.output_tail.append(line)

    def events(self) -> list[tuple[str, Path]]:
        """(kind, path) for downloads finished since the last call; kind is complete or error."""
        with open(self._events_path, "rb") as handle:
            handle.seek(self._events_offset)
            data = handle.read()
        end = data.rfind(b"\n") + 1  # a hook may be mid-write: take whole lines only
        self._events_offset += end
        found = []
        for line in data[:end].decode(errors="replace").splitlines():
            kind, _, path = line.partition("\t")
            if path:
                found.append((kind, Path(path)))
        return found

    def running(self) -> bool:
        return self._proc.poll() is None

    def returncode(self) -> int | None:
        return self._proc.poll()

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM lets aria2c save its resume records; SIGKILL only if it does not stop."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=grace_s)
        self._reader.join(timeout=5)

    def __enter__(self) -> "Aria2Process":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
