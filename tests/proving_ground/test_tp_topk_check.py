"""proving_ground/device/tp_topk_check.py on the CPU: the vocab-sharded draft top-K with real processes and
real collectives (torch.distributed over gloo), against one rank's whole-vocabulary top-K. On two
GPUs the same script runs over NCCL (docs/proving-ground.md, the tp2 run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).resolve().parents[2] / "proving_ground" / "device" / "tp_topk_check.py"


@pytest.mark.parametrize("tp", [2, 3])
def test_sharded_top_k_over_real_collectives_equals_one_rank(tp):
    done = subprocess.run([sys.executable, str(CHECK), "--device", "cpu", "--tp", str(tp)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert f"TP{tp} on cpu: 5/5 cases equal TP1" in done.stdout
