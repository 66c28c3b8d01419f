"""Fixtures for the repro tests (helpers live in repro_helpers.py)."""

from __future__ import annotations

import os

import pytest

from repro_helpers import FAKE_NVIDIA_SMI, cpu_path


@pytest.fixture
def fake_gpu_path(tmp_path) -> callable:
    """Returns PATH with a fake nvidia-smi reporting 8 GPUs (name and driver chosen by the test)."""

    def make(name: str = "NVIDIA RTX PRO 6000 Blackwell Server Edition", driver: str = "580.95.05") -> str:
        bindir = tmp_path / "fake-bin"
        bindir.mkdir(exist_ok=True)
        tool = bindir / "nvidia-smi"
        tool.write_text(FAKE_NVIDIA_SMI.replace("NAME", name).replace("DRIVER", driver))
        tool.chmod(0o755)
        return f"{bindir}{os.pathsep}{cpu_path()}"

    return make

