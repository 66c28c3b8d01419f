"""The suite runs in a venv of its own (tests/run.sh: .cache/test-venv), apart from the quick
start's .venv, so README's two commands give the same results in either order. Run on its own
after the quick start by test_quickstart_clone, as README orders them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from repro_helpers import REPO


def test_the_suite_does_not_run_in_the_quick_starts_venv_and_sees_no_sglang(tmp_path):
    assert Path(sys.prefix).resolve() != (REPO / ".venv").resolve(), "run the suite with `bash tests/run.sh`"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found = subprocess.run([sys.executable, "-c", "import importlib.util as u; print(u.find_spec('sglang'))"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert found.stdout.strip() == "None", f"the suite's python sees an installed sglang: {found.stdout}"
