"""env/quickstart.sh's own argument handling and failure reporting (fast; the full run is test_quickstart_clone)."""

from __future__ import annotations

import os
import subprocess

from repro_helpers import REPO, cpu_path

QUICKSTART = REPO / "env" / "quickstart.sh"


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(QUICKSTART), *args], env=dict(os.environ, PATH=cpu_path(), **env),
                          capture_output=True, text=True, timeout=120)


def test_help_describes_the_steps():
    result = _run("--help")
    assert result.returncode == 0
    assert "--profile P" in result.stdout and "k26-deploy apply" in result.stdout


def test_unknown_argument_is_a_usage_error():
    result = _run("--frobnicate")
    assert result.returncode == 2
    assert "quickstart: error: unknown argument: --frobnicate" in result.stderr


def test_a_failing_setup_stops_at_step_1_with_the_plan_shown(tmp_path):
    result = _run("--venv", str(tmp_path / "venv"), PYTHON=str(tmp_path / "no-such-python"))
    assert result.returncode == 1
    assert "Plan:" in result.stdout and "Stopped after rendering" not in result.stdout
    assert "no-such-python not found" in result.stderr
    assert "quickstart: error: step 1: setup failed" in result.stderr

