"""SGLang 0.5.17's commit as one Triton kernel against its torch ops, in Triton's CPU interpreter
(commit_kernel_cases.py); on a GPU proving_ground/device/graph_check.py runs it for real. The
commit's maths import no SGLang, so this runs in the main test process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def test_the_fused_commit_matches_the_torch_ops_in_the_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, str(HERE / "commit_kernel_cases.py")], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "18 cases agree" in done.stdout


def test_the_commit_refuses_the_kernel_on_the_cpu_without_the_interpreter(monkeypatch):
    import torch

    from k26_ddtree.sglang.v0_5_17.ddtree_utils import commit_step

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    rows = torch.zeros(1, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        commit_step(rows, torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 8, dtype=torch.int32),
                    torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), fused=True)
