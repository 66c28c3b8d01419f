"""SLOW (about two minutes): README's two commands, `bash env/quickstart.sh` then `bash tests/run.sh`,
in that order on a clean clone of this repository.

The clone's venvs (the quick start's .venv and the suite's .cache/test-venv) are its own, so
the suite's venv is never modified. To stay offline and fast on CI they are backed by the
suite's installed packages (a .pth line: torch, pyyaml, jinja2, hatchling, pytest are found
there) and pip resolves from local files only (the pinned SGLang wheel cached for this run).
The commands themselves run unchanged: setup installs sglang 0.5.11 --no-deps and the clone
(editable) into .venv, then apply, detect (no GPU), render + validate, and the quick start must
stop with the next step printed; then the clone's own tests/run.sh must not see that sglang.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from k26_ddtree.fetch.hub import DEFAULT_DRAFTER_REPO
from k26_ddtree.repro.setup import cpu_conflicts_note
from k26_ddtree.repro.sglang_versions import DEFAULT, PINS
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


def _offline_env(wheels: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PIP_", "K26_", "VIRTUAL_ENV"))}
    env.update(PATH=cpu_path(), PYTHON=sys.executable, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels),
               PIP_NO_BUILD_ISOLATION="0", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def _readme_command(checkout: Path, wheels: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    """`bash SCRIPT ARGS` at the clone's root, as README writes it."""
    return subprocess.run(["bash", script, *args], cwd=checkout, env=_offline_env(wheels),
                          capture_output=True, text=True, timeout=900)


def _quickstart(checkout: Path, wheels: Path, *args: str) -> subprocess.CompletedProcess:
    return _readme_command(checkout, wheels, "env/quickstart.sh", *args)


def _editable_source(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import importlib.metadata as m; "
                           "print(m.distribution('k26-ddtree').read_text('direct_url.json'))"],
                          capture_output=True, text=True, timeout=60).stdout


def test_readme_quick_start_then_the_suite_on_a_clean_clone():
    # The clone's venvs see the suite's packages: an sglang among them would hide what is tested.
    found = subprocess.run([sys.executable, "-c", "import importlib.util as u; print(u.find_spec('sglang'))"],
                           cwd=REPO.parent, capture_output=True, text=True, timeout=60)
    assert found.stdout.strip() == "None", "run the suite with `bash tests/run.sh` (a venv without sglang)"
    work = REPO / ".cache" / f"repro-quickstart-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    suite_before = _editable_source(Path(sys.executable))
    try:
        checkout = work / "k26-ddtree"
        checkout.mkdir()
        how = _checkout(checkout)
        venv = checkout / ".venv"  # where README's `bash env/quickstart.sh` puts it
        _suite_backed_venv(venv)
        wheels = _pinned_wheel_dir()

        first = _quickstart(checkout, wheels)
        log = f"[{how}]\n--- stdout\n{first.stdout[-6000:]}\n--- stderr\n{first.stderr[-3000:]}"
        assert first.returncode == 0, log
        out = first.stdout
        assert "Plan:" in out and "==> [1/5] Set up the venv" in out, log
        assert "pip install --no-deps sglang==0.5.11" in out, log
        assert f"pip install -e {checkout} --no-warn-conflicts" in out, log
        assert cpu_conflicts_note(PINS[DEFAULT]) in out.splitlines(), log
        assert "dependency resolver" not in out + first.stderr, log
        assert "==> [2/5] Patch the pinned SGLang and verify it" in out, log
        assert "no GPUs here: using profile pcie-ep8 for a dry render only" in out, log
        unit = checkout / ".cache" / "quickstart" / "k26-ddtree.pcie-ep8.service"
        # CI and this machine have systemd-analyze (.ci/run installs systemd), so render checked the unit.
        assert f"unit rendered and validated (systemd-analyze verify): {unit}" in out, log
        assert "ExecStart=" in unit.read_text()
        assert "Stopped after rendering: no NVIDIA GPU here" in out, log
        assert "NEXT STEP, on the GPU box" in out and "sudo bash env/quickstart.sh --profile pcie-ep8" in out, log
        assert f"--drafter {DEFAULT_DRAFTER_REPO}" in out and "drafter repo>" not in out, log
        assert checkout.as_uri() in _editable_source(venv / "bin" / "python")

        # README's second command, after the first: the suite must not see the quick start's sglang.
        _suite_backed_venv(checkout / ".cache" / "test-venv")
        suite = _readme_command(checkout, wheels, "tests/run.sh", "tests/repro/test_suite_venv.py")
        assert suite.returncode == 0 and "1 passed" in suite.stdout, suite.stdout[-4000:] + suite.stderr[-2000:]

        second = _quickstart(checkout, wheels)
        assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-2000:]
        setup_lines = [line for line in second.stdout.splitlines() if line.startswith("[") and "/5]" in line]
        pending = [line for line in setup_lines if "already done" not in line]
        assert len(pending) == 1 and "Check the installed toolkit" in pending[0], second.stdout[-4000:]

        wrong = _quickstart(checkout, wheels, "--profile", "no-such-profile")
        assert wrong.returncode == 2, wrong.stdout[-4000:] + wrong.stderr[-2000:]
        assert "detect: unknown profile 'no-such-profile'" in wrong.stdout
        assert "quickstart: error: step 3: profile no-such-profile is not usable (reason above)\n" in wrong.stderr
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert _editable_source(Path(sys.executable)) == suite_before, "the suite's own venv must not change"
