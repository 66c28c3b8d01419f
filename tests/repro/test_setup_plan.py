"""`k26-deploy setup` / env/setup_env.sh: the plan for a GPU box and for a CPU machine, idempotency, refusals."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from k26_ddtree.errors import UserError
from k26_ddtree.repro import setup
from k26_ddtree.repro.sglang_versions import PINS
from repro_helpers import REPO, closed_port_url, cpu_path, local_index, run_cli


def test_gpu_dry_run_plans_cuda_toolkit_headers_and_pinned_stack(tmp_path, fake_gpu_path):
    venv = tmp_path / "venv"
    result = run_cli("setup", "--dry-run", "--venv", str(venv), "--cuda-home", str(tmp_path / "no-cuda"),
                     path=fake_gpu_path())
    out = result.stdout
    assert result.returncode == 0, result.stderr
    assert "GPU machine (8x NVIDIA RTX PRO 6000 Blackwell Server Edition" in out
    assert "driver 580.95.05" in out
    assert "cuda-keyring_1.1-1_all.deb" in out
    assert "apt-get install -y --no-install-recommends cuda-toolkit-13-0" in out
    assert f"-m venv {venv}" in out
    assert "pip install torch==2.11.0 torchvision==0.26.0 torchaudio==2.11.0 sglang==0.5.11" in out
    assert f"pip install -e {REPO}" in out
    assert "--no-deps" not in out
    assert "dry run done" in out
    assert not venv.exists(), "a dry run must not create anything"


def test_gpu_dry_run_skips_a_toolkit_already_at_cuda_home(tmp_path, fake_gpu_path):
    cuda_home = tmp_path / "cuda-13.0"
    (cuda_home / "bin").mkdir(parents=True)
    nvcc = cuda_home / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(0o755)
    result = run_cli("setup", "--dry-run", "--venv", str(tmp_path / "venv"), "--cuda-home", str(cuda_home),
                     path=fake_gpu_path())
    assert result.returncode == 0, result.stderr
    assert f"Add NVIDIA's CUDA apt repository: already done (CUDA 13.0 already at {cuda_home})" in result.stdout
    assert "cuda-toolkit-13-0" not in result.stdout


def test_gpu_with_an_old_driver_is_refused_with_one_line(tmp_path, fake_gpu_path):
    result = run_cli("setup", "--dry-run", "--venv", str(tmp_path / "venv"), path=fake_gpu_path(driver="550.54.15"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "driver 550.54.15 is older than CUDA 13.0 needs (>= 580)" in result.stderr


def test_a_file_as_venv_is_refused_with_one_line(tmp_path):
    a_file = tmp_path / "venv"
    a_file.write_text("not a venv\n")
    result = run_cli("setup", "--dry-run", "--venv", str(a_file), path=cpu_path())
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"k26-deploy: error: --venv {a_file} exists and is not a directory"


def test_cpu_dry_run_installs_sglang_without_deps_and_no_cuda(tmp_path):
    venv = tmp_path / "venv"
    with local_index({"torch": "<a href='torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl'>torch</a>"}) as index:
        result = run_cli("setup", "--dry-run", "--venv", str(venv), "--cpu-torch-index", index, path=cpu_path())
    out = result.stdout
    assert result.returncode == 0, result.stderr
    assert "no GPU (nvidia-smi lists none)" in out
    assert f"pip install torch --index-url {index} --no-warn-conflicts" in out
    assert "pip install --no-deps sglang==0.5.11" in out
    assert f"pip install -e {REPO} --no-warn-conflicts" in out
    # pip's 60-line "dependency conflicts" ERROR about sglang's CUDA stack is off, and one line says why.
    assert setup.cpu_conflicts_note(PINS["0.5.11"]) in out.splitlines()
    assert "cuda" not in out.lower().replace("no cuda stack", "").replace("without its cuda stack", "").replace(
        "(its cuda stack)", "")
    assert not venv.exists()


def _fake_torch_wheel(folder: Path) -> None:
    """A real, installable wheel named torch 2.13.0 (a few bytes): what pip's find-links offers here."""
    folder.mkdir()
    info = "torch-2.13.0.dist-info"
    with zipfile.ZipFile(folder / "torch-2.13.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("torch/__init__.py", "__version__ = '2.13.0'\n")
        wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", f"torch/__init__.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")


def test_an_unreachable_cpu_torch_index_is_asked_once_then_torch_comes_quietly_from_pip(tmp_path):
    """pip retried an unreachable index for two minutes, 80 warnings; now one bounded question, one note."""
    venv, wheels, index = tmp_path / "venv", tmp_path / "wheels", closed_port_url()
    _fake_torch_wheel(wheels)
    local_only = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels), "PIP_CONFIG_FILE": os.devnull}
    started = time.monotonic()
    result = run_cli("setup", "--venv", str(venv), "--gpu", "no", "--cpu-torch-index", index,
                     extra_env=local_only)
    out = result.stdout
    assert f"setup: asking the CPU torch index {index} (10 s at most)" in out.splitlines()
    assert "[2/5] Install a CPU-only torch\n" in out
    assert (f"      note: {index} does not answer (offline, or blocked here): torch 2.13.0 from pip's own "
            "sources instead") in out
    assert "pip install torch==2.13.0 --no-warn-conflicts\n" in out and "Successfully installed torch-2.13.0" in out
    assert "--index-url" not in out and "Retrying" not in out + result.stderr
    # The sglang step finds no wheel in this local-only setup: the run stops there, torch in place.
    assert "step 3/5 (Install sglang 0.5.11 sources without dependencies" in result.stderr
    assert any(venv.glob("lib/python*/site-packages/torch/__init__.py"))
    assert time.monotonic() - started < 120


def test_setup_env_sh_runs_the_same_plan(tmp_path):
    """The shell front door and the CLI print the same steps (one implementation)."""
    venv = tmp_path / "venv"
    env = dict(os.environ, PATH=cpu_path(), PYTHON=sys.executable)
    shell = subprocess.run(["bash", str(REPO / "env" / "setup_env.sh"), "--dry-run", "--venv", str(venv)],
                           env=env, text=True, capture_output=True, timeout=120)
    cli = run_cli("setup", "--dry-run", "--venv", str(venv))
    assert shell.returncode == 0, shell.stderr
    steps = lambda text: [line for line in text.splitlines() if line.startswith(("[", "      $"))]
    assert steps(shell.stdout) == steps(cli.stdout)
    assert len(steps(shell.stdout)) >= 5


def test_cpu_dry_run_on_the_suites_own_venv_only_lists_what_is_missing():
    """The suite's venv has torch and this checkout installed: those steps read 'already done'."""
    result = run_cli("setup", "--dry-run", "--venv", str(Path(sys.prefix)))
    assert result.returncode == 0, result.stderr
    assert "Create the venv" in result.stdout and "already done (it exists)" in result.stdout
    assert "Install a CPU-only torch: already done (torch " in result.stdout


def _facts(tmp_path: Path, **changes) -> setup.Facts:
    base = setup.Facts(
        source_root=REPO, venv=tmp_path / "venv", python="/usr/bin/python3.12", python_version=(3, 12),
        python_headers=False, python_ensurepip=False, venv_exists=False, gpus=("GPU 0: NVIDIA B300",),
        driver="580.95.05", cuda_home=Path("/usr/local/cuda-13.0"), cuda_home_release=None,
        default_cuda_release=None, os_id="ubuntu", os_version="24.04", arch="x86_64", aria2=False,
        has_apt=True, is_root=True, has_sudo=True)
    return replace(base, **changes)


def _commands(steps) -> list[str]:
    return [" ".join(cmd) for step in steps for cmd in step.commands]


def test_fresh_ubuntu_2404_gpu_box_plan(tmp_path):
    commands = _commands(setup.plan(_facts(tmp_path), gpu=True))
    assert ("curl -fsSL -o /tmp/cuda-keyring_1.1-1_all.deb https://developer.download.nvidia.com/compute/cuda/"
            "repos/ubuntu2404/x86_64/cuda-keyring_1.1-1_all.deb") in commands
    assert "dpkg -i /tmp/cuda-keyring_1.1-1_all.deb" in commands
    assert ("env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
            "cuda-toolkit-13-0 python3.12-dev python3.12-venv aria2") in commands
    assert f"/usr/bin/python3.12 -m venv {tmp_path / 'venv'}" in commands
    assert not any("ln -s" in command for command in commands), "never symlink between toolkits"


def test_other_default_toolkit_is_switched_with_update_alternatives(tmp_path):
    steps = setup.plan(_facts(tmp_path, default_cuda_release="12.8"), gpu=True)
    assert "update-alternatives --set cuda /usr/local/cuda-13.0" in _commands(steps)


def test_non_root_uses_sudo_and_without_sudo_says_so(tmp_path):
    commands = _commands(setup.plan(_facts(tmp_path, is_root=False), gpu=True))
    assert any(c.startswith("sudo env DEBIAN_FRONTEND=noninteractive apt-get install") for c in commands)
    with pytest.raises(UserError, match="needs root and sudo is not installed"):
        setup.plan(_facts(tmp_path, is_root=False, has_sudo=False), gpu=True)


def test_unknown_distribution_without_toolkit_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="no CUDA 13.0 apt repository known for fedora 40"):
        setup.plan(_facts(tmp_path, os_id="fedora", os_version="40"), gpu=True)


def test_unsupported_python_is_refused(tmp_path):
    with pytest.raises(UserError, match="python 3.9 is not supported by sglang 0.5.11"):
        setup.plan(_facts(tmp_path, python_version=(3, 9)), gpu=True)
    with pytest.raises(UserError, match=r"python 3.14 is not supported by sglang 0.5.17 \(use one of 3.10, 3.11, "
                                        r"3.12, 3.13; pass --python\)"):
        setup.plan(_facts(tmp_path, python_version=(3, 14), pins=PINS["0.5.17"]), gpu=True)


def test_gpu_dry_run_installs_the_chosen_versions_pins(tmp_path, fake_gpu_path):
    venv = tmp_path / "venv"
    result = run_cli("setup", "--dry-run", "--sglang", "0.5.17", "--venv", str(venv),
                     "--cuda-home", str(tmp_path / "no-cuda"), path=fake_gpu_path())
    assert result.returncode == 0, result.stderr
    assert "CUDA 13.0 + torch 2.11.0 + sglang 0.5.17" in result.stdout.splitlines()[0]
    assert "Install torch 2.11.0 (CUDA 13.0 build) + sglang 0.5.17 with its dependencies: would run" in result.stdout
    assert "pip install torch==2.11.0 torchvision==0.26.0 torchaudio==2.11.0 sglang==0.5.17" in result.stdout
    assert "0.5.11" not in result.stdout
    assert not venv.exists()


def test_cpu_dry_run_installs_the_chosen_versions_sources(tmp_path):
    with local_index({"torch": "<a href='torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl'>torch</a>"}) as index:
        result = run_cli("setup", "--dry-run", "--sglang", "0.5.17", "--venv", str(tmp_path / "venv"),
                         "--cpu-torch-index", index, path=cpu_path())
    assert result.returncode == 0, result.stderr
    assert "no GPU (nvidia-smi lists none): sglang 0.5.17 sources without its CUDA stack" in result.stdout
    assert "pip install --no-deps sglang==0.5.17" in result.stdout
    assert setup.cpu_conflicts_note(PINS["0.5.17"]) in result.stdout.splitlines()


def test_a_venv_with_the_other_version_gets_the_chosen_one(tmp_path):
    """Switching versions in place: the installed 0.5.11 is not taken for 0.5.17, and back."""
    installed = {"torch": "2.11.0", "torchvision": "0.26.0", "torchaudio": "2.11.0", "sglang": "0.5.11"}
    facts = _facts(tmp_path, venv_exists=True, python_headers=True, python_ensurepip=True, aria2=True,
                   cuda_home_release="13.0", venv_k26_source=REPO.as_uri(), venv_dists=installed)
    assert "sglang==0.5.17" in " ".join(_commands(setup.plan(replace(facts, pins=PINS["0.5.17"]), gpu=True)))
    assert not any("sglang==" in c for c in _commands(setup.plan(facts, gpu=True)))
    cpu = _commands(setup.plan(replace(facts, pins=PINS["0.5.17"]), gpu=False))
    assert any(c.endswith("pip install --no-deps sglang==0.5.17") for c in cpu)


@pytest.mark.parametrize("front_door", ["cli", "setup_env.sh"])
def test_an_unknown_sglang_version_is_refused_with_one_line_naming_the_known_ones(tmp_path, front_door):
    venv = tmp_path / "venv"
    if front_door == "cli":
        result = run_cli("setup", "--sglang", "0.5.99", "--venv", str(venv))
        prefix = "k26-deploy"
    else:
        env = dict(os.environ, PATH=cpu_path(), PYTHON=sys.executable)
        result = subprocess.run(["bash", str(REPO / "env" / "setup_env.sh"), "--sglang", "0.5.99", "--venv", str(venv)],
                                env=env, text=True, capture_output=True, timeout=120)
        prefix = "setup"
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"{prefix}: error: --sglang 0.5.99: not a version k26-ddtree installs; known: 0.5.11 (default), 0.5.17"]
    assert result.stdout == "" and not venv.exists()


def test_second_run_on_a_complete_gpu_box_changes_nothing(tmp_path):
    venv = tmp_path / "venv"
    done = _facts(
        tmp_path, venv=venv, venv_exists=True, python_headers=True, python_ensurepip=True, aria2=True,
        cuda_home_release="13.0", default_cuda_release="13.0", venv_k26_source=REPO.as_uri(),
        venv_dists={"torch": "2.11.0", "torchvision": "0.26.0", "torchaudio": "2.11.0", "sglang": "0.5.11"})
    steps = setup.plan(done, gpu=True)
    pending = [step.title for step in steps if not step.satisfied]
    assert pending == ["Check the installed toolkit"], pending


def test_cpu_torch_on_a_gpu_box_is_replaced(tmp_path):
    wrong = _facts(tmp_path, venv_exists=True, venv_dists={
        "torch": "2.11.0+cpu", "torchvision": "0.26.0", "torchaudio": "2.11.0", "sglang": "0.5.11"})
    titles = [step.title for step in setup.plan(wrong, gpu=True) if not step.satisfied]
    assert any(title.startswith("Install torch 2.11.0 (CUDA 13.0 build)") for title in titles)


def test_a_failing_step_stops_setup_with_exit_1_and_a_rerun_skips_what_was_done(tmp_path):
    venv = tmp_path / "venv"
    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "no-wheels")}
    first = run_cli("setup", "--venv", str(venv), "--gpu", "no", "--cpu-torch-index", closed_port_url(),
                    extra_env=offline)
    assert first.returncode == 1, first.stdout + first.stderr
    assert "[1/5] Create the venv" in first.stdout and "ok (" in first.stdout
    assert "k26-deploy: error: step 2/5 (Install a CPU-only torch) failed: " in first.stderr
    assert "exited with 1" in first.stderr and "Traceback" not in first.stderr
    again = run_cli("setup", "--venv", str(venv), "--gpu", "no", "--dry-run", extra_env=offline)
    assert again.returncode == 0
    assert f"[1/5] Create the venv {venv}: already done (it exists)" in again.stdout
