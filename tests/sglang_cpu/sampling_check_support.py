"""proving_ground/device/sampling_check.py on the CPU, shared by each SGLang version's tests:
its adapter drives that version's real DDTree verify input (SGLang falls back to the torch
sampling walk without sgl_kernel's tree kernel), and the script refuses a machine without a GPU."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "proving_ground" / "device" / "sampling_check.py"


def load_check():
    spec = importlib.util.spec_from_file_location("sampling_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_serving_path(version: str) -> list[str]:
    """Four of the 30 cases (the whole law, top-p, top-k, both) and both controls through
    `version`'s verify input; the printed lines."""
    check = load_check()
    check.ROWS_PER_VERIFY = 1 << 12  # several verifies per step, as on the GPU
    lines: list[str] = []
    cases = [next(c for c in check.CASES if (c.top_p is not None, c.top_k is not None) == cut)
             for cut in ((False, False), (True, False), (False, True), (True, True))]
    assert check.run(version, "cpu", 20_000, 1e-4, cases=cases, say=lines.append), "\n".join(lines)
    assert lines[-1] == f"sampling exactness: {len(cases)}/{len(cases)}, controls caught"
    return lines


def without_gpu_the_check_refuses_in_one_line() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--draws", "1000"], capture_output=True, text=True,
                            timeout=300, env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "sampling_check: no CUDA GPU: the tree kernel runs only there (tests/core checks the torch path)"]
