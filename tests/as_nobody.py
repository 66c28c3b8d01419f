"""Running the toolkit as uid nobody, wherever the checkout sits.

A clone under a root-only folder (/root, say) holds a venv and sources that nobody may not
reach. So a test that needs another user copies what that run imports into a world-readable
folder, and runs it with an interpreter nobody may execute."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from k26_ddtree.repro import bundle

AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
# The checkout's own interpreter, else the system's; the copied packages need the same minor version.
_CANDIDATES = (sys.executable, "/usr/bin/python3")
_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


def _runs_as_nobody(python: str) -> bool:
    try:
        done = subprocess.run([*AS_NOBODY, python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=60, cwd="/")
    except OSError:
        return False
    return done.returncode == 0 and done.stdout.strip() == _VERSION


def _third_party_roots(modules: list[str]) -> list[Path]:
    """The site-packages folders and files that importing `modules` loads, with their shared libraries."""
    script = ("import importlib, json, sys\n"
              f"for m in {modules!r}: importlib.import_module(m)\n"
              "print(json.dumps(sorted({getattr(m, '__file__', None) or '' for m in list(sys.modules.values())})))")
    files = json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                      timeout=300, env={**os.environ, "MPLBACKEND": "Agg"}).stdout)
    sites = {Path(p).resolve() for p in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])}
    roots = set()
    for name in files:
        path = Path(name).resolve() if name else None
        for site in sites:
            if path is not None and site in path.parents:
                top = site / path.relative_to(site).parts[0]
                roots.add(top)
    # Wheels repaired by auditwheel keep their shared libraries in NAME.libs beside the package,
    # under the distribution's name (pillow.libs for PIL).
    for site in sites:
        roots.update(p for p in site.glob("*.libs") if p.is_dir())
    return sorted(roots)


class NobodyTree:
    """A world-readable folder with k26_ddtree and what `modules` import, and an interpreter for it.

    parent: where the folder goes (default: the system's temporary folder); a test that runs it
    inside a namespace with a private /tmp puts it on the host's own filesystem instead."""

    def __init__(self, modules: list[str] = (), parent: Path | None = None):
        if os.geteuid() != 0 or not shutil.which("setpriv"):
            pytest.skip("needs root and setpriv to run as nobody")
        self.python = next((p for p in _CANDIDATES if Path(p).exists() and _runs_as_nobody(p)), None)
        if self.python is None:
            pytest.skip(f"no python {_VERSION} that nobody may run (tried {', '.join(_CANDIDATES)})")
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
            parent.chmod(0o755)
        self.root = Path(tempfile.mkdtemp(prefix="k26-nobody-", dir=parent))
        self.root.chmod(0o755)
        site = self.root / "site"
        # The toolkit as the offline bundle lays it out: the package and the data it reads.
        bundle.copy_self(site)
        ignore = shutil.ignore_patterns("__pycache__")
        for root in _third_party_roots(list(modules)):
            (shutil.copytree(root, site / root.name, ignore=ignore) if root.is_dir()
             else shutil.copy2(root, site / root.name))
        subprocess.run(["chmod", "-R", "a+rX", str(self.root)], check=True)
        self.env = {**os.environ, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}

    def scratch(self, name: str, mode: int = 0o777) -> Path:
        """A folder under the tree that nobody may use as `mode` says."""
        path = self.root / name
        path.mkdir()
        path.chmod(mode)
        return path

    def run(self, args: list[str], **kwargs) -> subprocess.CompletedProcess:
        env = {**self.env, **kwargs.pop("env", {})}
        return subprocess.run([*AS_NOBODY, self.python, *args], capture_output=True, text=True, cwd="/", env=env,
                              **kwargs)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

