"""apply makes this k26_ddtree importable by sglang's Python: a .pth in a real site dir, else a marked copy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from k26_ddtree.errors import UserError
from k26_ddtree.hashing import tree_digest
from k26_ddtree.patchset import apply, importable

REPO = Path(__file__).resolve().parents[2]
_WHERE = "import k26_ddtree, k26_ddtree.patchset.pins; print(k26_ddtree.__file__)"


def _quiet(line: str) -> None:
    pass


def _import_from(python: str, *extra_path: Path) -> subprocess.CompletedProcess:
    # -I: no PYTHONPATH, no user site; what a systemd unit's interpreter sees.
    code = f"import sys; sys.path[:0] = {[str(p) for p in extra_path]!r}; {_WHERE}"
    return subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, timeout=60)


def test_a_plain_directory_gets_a_marked_copy(site, synthetic_patch_set):
    apply.apply(site, synthetic_patch_set, out=_quiet)
    copy = site / "k26_ddtree"
    assert (copy / importable.COPY_MARKER).is_file()
    assert tree_digest(copy, "*.py") == tree_digest(importable.our_package(), "*.py")
    found = _import_from(sys.executable, site)
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()) == copy / "__init__.py"
    assert apply.check(site, synthetic_patch_set, out=_quiet) == 0

    (copy / "stale_module.py").write_text("OLD = True\n")
    assert importable.plan(site).action == importable.COPY
    apply.apply(site, synthetic_patch_set, out=_quiet)
    assert not (copy / "stale_module.py").exists()

    apply.revert(site, synthetic_patch_set, out=_quiet)
    assert not copy.exists()


def test_a_foreign_k26_ddtree_beside_sglang_is_refused(site, synthetic_patch_set, snapshot):
    other = site / "k26_ddtree"
    other.mkdir()
    (other / "__init__.py").write_text("__version__ = 'someone else'\n")
    before = snapshot(site)
    with pytest.raises(UserError, match="different k26_ddtree"):
        apply.apply(site, synthetic_patch_set, out=_quiet)
    assert snapshot(site) == before


def test_applied_without_the_package_is_not_healthy(site, synthetic_patch_set):
    apply.apply(site, synthetic_patch_set, out=_quiet)
    importable.undo(site)
    lines = []
    assert apply.check(site, synthetic_patch_set, out=lines.append) == 1
    assert any("MISSING" in line for line in lines)


@pytest.fixture
def venv(tmp_path, make_site) -> tuple[Path, Path]:
    """(python, site-packages) of a fresh venv holding the pristine sglang files and nothing of ours."""
    root = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    purelib = subprocess.run([str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    return python, make_site(Path(purelib))


def test_a_venv_site_packages_gets_a_pth_to_the_checkout(venv, synthetic_patch_set):
    python, site_packages = venv
    assert _import_from(str(python)).returncode != 0
    apply.apply(site_packages, synthetic_patch_set, out=_quiet)
    pth = site_packages / importable.PTH_NAME
    assert pth.read_text().splitlines()[-1] == str(REPO)
    assert not (site_packages / "k26_ddtree").exists()
    found = _import_from(str(python))
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()) == REPO / "k26_ddtree" / "__init__.py"
    assert apply.check(site_packages, synthetic_patch_set, out=_quiet) == 0
    assert importable.plan(site_packages).action == importable.NOTHING

    apply.revert(site_packages, synthetic_patch_set, out=_quiet)
    assert not pth.exists()
    assert _import_from(str(python)).returncode != 0


def test_check_says_blocked_when_a_different_k26_ddtree_appears(site, synthetic_patch_set):
    apply.apply(site, synthetic_patch_set, out=_quiet)
    copy = site / "k26_ddtree"
    (copy / importable.COPY_MARKER).unlink()
    (copy / "__init__.py").write_text("__version__ = 'someone else'\n")
    lines = []
    assert apply.check(site, synthetic_patch_set, out=lines.append) == 2
    assert any("BLOCKED" in line for line in lines)


def test_a_non_package_k26_ddtree_dir_is_never_copied_over(site, synthetic_patch_set, snapshot):
    data = site / "k26_ddtree" / "_data"
    data.mkdir(parents=True)
    (data / "kept.txt").write_text("an editable install leaves its data here\n")
    before = snapshot(site)
    with pytest.raises(UserError, match="not a k26_ddtree package"):
        apply.apply(site, synthetic_patch_set, out=_quiet)
    assert snapshot(site) == before
