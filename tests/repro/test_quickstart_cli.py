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



def test_an_unknown_sglang_version_is_refused_before_anything_runs(tmp_path):
    venv = tmp_path / "venv"
    for args in (["--sglang", "0.5.99"], ["--sglang=0.5.99"]):
        result = _run("--venv", str(venv), *args)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.splitlines() == [
            "quickstart: error: --sglang 0.5.99: not a version k26-ddtree installs; known: 0.5.11 (default), 0.5.17"]
    for args in (["--sglang"], ["--sglang="], ["--sglang", ""]):
        result = _run("--venv", str(venv), *args)
        assert result.returncode == 2 and result.stderr == "quickstart: error: --sglang needs a version\n", args
    assert not venv.exists()


def test_the_chosen_version_goes_to_setup(tmp_path):
    venv = tmp_path / "venv"
    result = _run("--venv", str(venv), "--sglang", "0.5.17", PYTHON=str(tmp_path / "no-such-python"))
    assert f"1. Set up the venv and the pinned stack        bash env/setup_env.sh --venv {venv} --sglang 0.5.17" \
        in result.stdout
    assert result.returncode == 1 and "quickstart: error: step 1: setup failed" in result.stderr
