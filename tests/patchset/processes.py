"""`python -m k26_ddtree apply` as real processes, paused at a transaction checkpoint on request
(the test-only K26_APPLY_TEST_PAUSE hook, k26_ddtree/patchset/transaction.py), and the whole
states a site may be in: exactly pristine or exactly applied, byte for byte."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from k26_ddtree.patchset import apply
from k26_ddtree.patchset.transaction import PAUSE_ENV, pause_label

REPO = Path(__file__).resolve().parents[2]
SERVER_ARGS = "sglang/srt/server_args.py"
SECOND_TARGET = "sglang/srt/speculative/dflash_utils.py"  # the synthetic patch set's second file


class Command:
    """One `k26-deploy apply ...` child; stdout and stderr go to files, unbuffered, so a test can
    read what it has said so far."""

    def __init__(self, site: Path, patch_set: Path, *args: str, pause: Path | None = None, hold: str | None = None):
        self.site, self.pause = site, pause
        self.stdout_path = site.parent / f"out-{time.monotonic_ns()}.txt"
        self.stderr_path = self.stdout_path.with_suffix(".err")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if pause is not None:
            pause.mkdir(exist_ok=True)
            env[PAUSE_ENV] = str(pause)
            if hold is not None:
                self.hold_file(hold).touch()
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "k26_ddtree", "apply", "--sglang-dir", str(site), "--patch-set", str(patch_set), *args],
                stdout=out, stderr=err, cwd=REPO, env=env)

    def hold_file(self, doing: str) -> Path:
        return self.pause / f"{pause_label(doing)}.hold"

    def wait_paused(self, doing: str, timeout: float = 60) -> None:
        paused = self.pause / f"{pause_label(doing)}.paused"
        deadline = time.monotonic() + timeout
        while not paused.exists():
            assert self.proc.poll() is None, f"finished (rc {self.proc.returncode}) without pausing at {doing!r}: {self.text()}"
            assert time.monotonic() < deadline, f"no pause at {doing!r} within {timeout} s"
            time.sleep(0.02)

    def wait_for_output(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.stdout:
            assert self.proc.poll() is None, f"finished without printing {text!r}: {self.text()}"
            assert time.monotonic() < deadline, f"{text!r} not printed within {timeout} s"
            time.sleep(0.02)

    def release(self, doing: str) -> None:
        self.hold_file(doing).unlink()

    def wait(self, timeout: float = 120) -> int:
        return self.proc.wait(timeout=timeout)

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text()

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def text(self) -> str:
        return f"stdout:\n{self.stdout}\nstderr:\n{self.stderr}"


def run(site: Path, patch_set: Path, *args: str) -> Command:
    command = Command(site, patch_set, *args)
    command.wait()
    return command


def whole_states(make_site, patch_set: Path, snapshot, where: Path) -> dict[str, dict[str, bytes]]:
    """{"pristine": snapshot, "applied": snapshot} of a reference site built at `where`: every
    file, backups and the k26_ddtree copy included."""
    site = make_site(where)
    pristine = snapshot(site)
    apply.apply(site, patch_set, out=lambda line: None)
    return {"pristine": pristine, "applied": snapshot(site)}


def which_whole_state(site: Path, states: dict[str, dict[str, bytes]], snapshot) -> str | None:
    now = snapshot(site)
    return next((name for name, files in states.items() if files == now), None)


def staged_leftovers(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*") if p.name.endswith(".k26-tmp"))
