"""The fused Triton kernels (tree_kernel.py, mask_kernel.py, walk_kernel.py), run on the
CPU by Triton's interpreter; on a GPU, test_core_tree.py's CUDA test and
proving_ground/device/graph_check.py run them for real."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from k26_ddtree.core import fused
from k26_ddtree.core.tree import build_ddtree

HERE = Path(__file__).resolve().parent


def test_fused_kernels_match_the_torch_ops_in_the_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parents[1])]))
    done = subprocess.run(
        [sys.executable, str(HERE / "kernel_cases.py")], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cases agree" in done.stdout


def test_asking_for_a_kernel_that_cannot_run_is_a_clear_error(monkeypatch):
    args = (torch.zeros(1, dtype=torch.long), torch.zeros(1, 2, 2, dtype=torch.long), torch.zeros(1, 2, 2))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="needs Triton's interpreter"):
        build_ddtree(*args, 2, fused=True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    wide = (torch.zeros(1, dtype=torch.long), torch.zeros(1, 7, 4, dtype=torch.long), torch.zeros(1, 7, 4))
    with pytest.raises(ValueError, match="at most 128 nodes"):
        build_ddtree(*wide, 200, fused=True)
    monkeypatch.setattr(fused, "_kernel", lambda module, name: None)
    with pytest.raises(ValueError, match="needs Triton, which cannot be imported"):
        build_ddtree(*args, 2, fused=True)
    assert build_ddtree(*args, 2).tokens.shape == (1, 3)


def test_cpu_calls_do_not_import_triton():
    """The default picks the torch ops on the CPU without touching Triton (a broken Triton
    install cannot break the CPU path)."""
    code = (
        "import sys, torch; from k26_ddtree.core.tree import build_ddtree; "
        "build_ddtree(torch.zeros(2, dtype=torch.long), torch.zeros(2, 7, 4, dtype=torch.long), torch.zeros(2, 7, 4), 8); "
        "assert 'triton' not in sys.modules, 'triton imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
