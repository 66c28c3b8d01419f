"""Helpers for the repro tests: a fake nvidia-smi, a PATH without one, the CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

FAKE_NVIDIA_SMI = """#!/bin/sh
# Stands in for nvidia-smi on a CPU machine: 8 GPUs of the NAME below, driver DRIVER.
case "$*" in
  "-L") i=0; while [ $i -lt 8 ]; do echo "GPU $i: NAME (UUID: GPU-0000000$i)"; i=$((i+1)); done ;;
  *driver_version*) i=0; while [ $i -lt 8 ]; do echo "DRIVER"; i=$((i+1)); done ;;
  "topo -m") printf '\\tGPU0\\tGPU1\\nGPU0\\t X \\tNV18\\nGPU1\\tNV18\\t X \\n' ;;
  *) echo "fake nvidia-smi: $*" ;;
esac
"""


def cpu_path() -> str:
    """PATH without any nvidia-smi on it, so the machine reads as having no GPU."""
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not Path(d, "nvidia-smi").exists()]
    return os.pathsep.join(dirs)




def run_cli(*args: str, path: str | None = None, cwd: Path | None = None, timeout: float = 300,
            extra_env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=path if path is not None else cpu_path())
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, "-m", "k26_ddtree", *args], cwd=cwd or REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
    )
