"""Patch sets to test `k26-deploy apply` with, and fresh copies of the pristine pinned sglang.

Every lifecycle test runs against a synthetic patch set (built here from the
pristine wheel: two edited files and one added file, so it exists whatever
full/ holds today) and against the shipped patches/sglang-0.5.11 when its full/
has files.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from k26_ddtree.patchset import regen
from k26_ddtree.patchset.lock import LOCK_NAME
from k26_ddtree.patchset.pins import FULL_DIR, PINS_FILE, default_root
from k26_ddtree.patchset.wheel import shipped_wheel

SHIPPED = default_root()
EDITED = {
    # appended lines; the second file also loses its final newline, which diffs must carry
    "sglang/srt/server_args.py": lambda text: text + b"\nK26_PATCHSET_PROBE = 1\n",
    "sglang/srt/speculative/dflash_utils.py": lambda text: text.replace(b"import ", b"import  ", 1).rstrip(b"\n"),
}
ADDED = {"sglang/srt/speculative/k26_probe.py": b"PROBE = 'added by the synthetic patch set'\n"}


@pytest.fixture(scope="session")
def synthetic_patch_set(pristine_sglang, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("synthetic-patch-set")
    shutil.copyfile(SHIPPED / PINS_FILE, root / PINS_FILE)
    for rel, edit in EDITED.items():
        target = root / FULL_DIR / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(edit((pristine_sglang / rel).read_bytes()))
    for rel, data in ADDED.items():
        (root / FULL_DIR / rel).write_bytes(data)
    regen.regenerate(root, shipped_wheel(), out=lambda line: None)
    return root


@pytest.fixture(scope="session")
def shipped_patch_set(tmp_path_factory) -> Path:
    """The shipped full/ files, with diffs and pins regenerated in a scratch dir.

    Regenerated so the apply mechanics are tested on today's full/ even before
    someone reruns regen; test_patchset_files.py checks the committed pins and
    diffs are current.
    """
    if not regen.full_files(SHIPPED):
        pytest.skip("the shipped patch set has no full/ files yet")
    root = tmp_path_factory.mktemp("shipped-patch-set")
    shutil.copyfile(SHIPPED / PINS_FILE, root / PINS_FILE)
    shutil.copytree(SHIPPED / FULL_DIR, root / FULL_DIR, ignore=shutil.ignore_patterns("__pycache__"))
    regen.regenerate(root, shipped_wheel(), out=lambda line: None)
    return root


@pytest.fixture(params=["synthetic", "shipped"])
def patch_set(request) -> Path:
    return request.getfixturevalue(f"{request.param}_patch_set")


def _site_dirs() -> set[str]:
    """The package directories any patch set under test touches (copying all 2,500 files is slow)."""
    rels = [*EDITED, *ADDED, *regen.full_files(SHIPPED)]
    return {"sglang", "sglang/srt"} | {rel.rsplit("/", 1)[0] for rel in rels}


def copy_site(pristine_sglang: Path, dest: Path) -> Path:
    """A writable site dir: the sglang dist-info and every file of the directories a patch set touches."""
    dest.mkdir(parents=True, exist_ok=True)
    for dist_info in pristine_sglang.glob("*.dist-info"):
        shutil.copytree(dist_info, dest / dist_info.name)
    for rel_dir in sorted(_site_dirs()):
        (dest / rel_dir).mkdir(parents=True, exist_ok=True)
        for path in (pristine_sglang / rel_dir).iterdir():
            if path.is_file():
                shutil.copyfile(path, dest / rel_dir / path.name)
    return dest


@pytest.fixture
def site(pristine_sglang, tmp_path) -> Path:
    return copy_site(pristine_sglang, tmp_path / "site")


@pytest.fixture
def make_site(pristine_sglang):
    """make_site(dest): a pristine site dir like `site`, at a place of the test's choosing."""
    return lambda dest: copy_site(pristine_sglang, dest)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != LOCK_NAME}


@pytest.fixture
def snapshot():
    """snapshot(root): every file under root (path -> bytes), to prove a refused command changed nothing.
    The site's lock file is left out: apply and --revert create it, and it stays (lock.py says why)."""
    return _snapshot
