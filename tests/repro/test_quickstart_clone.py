"""SLOW (about a minute): README's first command, `bash env/quickstart.sh`, on a clean clone of this repository.

The clone gets its own venv, so the suite's venv is never modified. To stay offline
and fast on CI it is backed by the suite's installed packages (a .pth line: torch,
pyyaml, jinja2, hatchling are found there) and pip resolves from local files only
(the pinned SGLang wheel cached for this run). The quick start itself runs unchanged:
setup installs sglang 0.5.11 --no-deps and the clone (editable) into that venv, then
apply, detect (no GPU), render + validate, and it must stop with the next step printed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from repro_helpers import REPO, cpu_path

pytestmark = pytest.mark.network  # the pinned SGLang wheel is downloaded once per run when not cached

PINNED_WHEEL = "sglang-0.5.11-cp311-cp311-manylinux_2_34_x86_64.whl"
QUICKSTART_FILES = ("env/quickstart.sh", "env/setup_env.sh", "k26_ddtree/repro/setup.py")


def _pinned_wheel_dir() -> Path:
    """The per-run wheel cache (tests/run.sh sets K26_WHEEL_CACHE), holding the pinned SGLang wheel."""
    cache = Path(os.environ.get("K26_WHEEL_CACHE") or REPO / ".cache" / "wheels")
    cache.mkdir(parents=True, exist_ok=True)
    if not (cache / PINNED_WHEEL).exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "sglang==0.5.11",
                        "-d", str(cache)], check=True, timeout=600)
    return cache


def _git(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    # CI checkouts may belong to another user than the one running the suite.
    return subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def _checkout(dest: Path) -> str:
    """A clean clone of HEAD; a copy of the working tree while HEAD does not have the quick start yet."""
    if all(_git("cat-file", "-e", f"HEAD:{path}").returncode == 0 for path in QUICKSTART_FILES):
        cloned = _git("clone", "-q", "--no-hardlinks", str(REPO), str(dest))
        assert cloned.returncode == 0, cloned.stderr
        return f"clone of HEAD {_git('rev-parse', '--short', 'HEAD').stdout.strip()}"
    listed = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard")
    assert listed.returncode == 0, listed.stderr
    for rel in filter(None, listed.stdout.split("\0")):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return "copy of the working tree (HEAD lacks the quick start files)"


def _suite_backed_venv(venv: Path) -> None:
    """A venv of its own whose imports fall back to the suite's packages (no pip/setuptools of its own)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "k26-suite-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")


def _quickstart(checkout: Path, venv: Path, wheels: Path, *args: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PIP_", "K26_", "VIRTUAL_ENV"))}
    env.update(PATH=cpu_path(), PYTHON=sys.executable, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels),
               PIP_NO_BUILD_ISOLATION="0", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return subprocess.run(["bash", str(checkout / "env" / "quickstart.sh"), "--venv", str(venv), *args],
                          cwd=checkout, env=env, capture_output=True, text=True, timeout=900)


def _editable_source(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import importlib.metadata as m; "
                           "print(m.distribution('k26-ddtree').read_text('direct_url.json'))"],
                          capture_output=True, text=True, timeout=60).stdout


def test_readme_quick_start_on_a_clean_clone_stops_after_validation():
    work = REPO / ".cache" / f"repro-quickstart-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    suite_before = _editable_source(Path(sys.executable))
    try:
        checkout = work / "k26-ddtree"
        checkout.mkdir()
        how = _checkout(checkout)
        venv = work / "venv"
        _suite_backed_venv(venv)
        wheels = _pinned_wheel_dir()

        first = _quickstart(checkout, venv, wheels)
        log = f"[{how}]\n--- stdout\n{first.stdout[-6000:]}\n--- stderr\n{first.stderr[-3000:]}"
        assert first.returncode == 0, log
        out = first.stdout
        assert "Plan:" in out and "==> [1/5] Set up the venv" in out, log
        assert "pip install --no-deps sglang==0.5.11" in out, log
        assert f"pip install -e {checkout}" in out, log
        assert "==> [2/5] Patch the pinned SGLang and verify it" in out, log
        assert "no GPUs here: using profile pcie-ep8 for a dry render only" in out, log
        unit = checkout / ".cache" / "quickstart" / "k26-ddtree.pcie-ep8.service"
        assert f"unit rendered and validated: {unit}" in out, log
        assert "ExecStart=" in unit.read_text()
        assert "Stopped after validation: no NVIDIA GPU here" in out, log
        assert "NEXT STEP, on the GPU box" in out and "sudo bash env/quickstart.sh --profile pcie-ep8" in out, log
        assert checkout.as_uri() in _editable_source(venv / "bin" / "python")

        second = _quickstart(checkout, venv, wheels)
        assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-2000:]
        setup_lines = [line for line in second.stdout.splitlines() if line.startswith("[") and "/5]" in line]
        pending = [line for line in setup_lines if "already done" not in line]
        assert len(pending) == 1 and "Check the installed toolkit" in pending[0], second.stdout[-4000:]

        wrong = _quickstart(checkout, venv, wheels, "--profile", "no-such-profile")
        assert wrong.returncode == 2, wrong.stdout[-4000:] + wrong.stderr[-2000:]
        assert "detect: unknown profile 'no-such-profile'" in wrong.stdout
        assert "quickstart: error: step 3: profile no-such-profile is not usable (reason above)\n" in wrong.stderr
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert _editable_source(Path(sys.executable)) == suite_before, "the suite's own venv must not change"
