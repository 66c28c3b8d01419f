"""MANIFEST.sha256 over the reproduction package, in `sha256sum` format, and its verification.

The package is the set of files someone needs to rebuild and re-run this
deployment: the patch set, unit templates, profiles, bench scripts and results,
env scripts and snapshots, drafter metadata and REPRODUCE.md. Paths are relative
to the root and sorted, so the same tree always gives the same bytes, and
`sha256sum -c MANIFEST.sha256 --strict` run at the root checks it too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from k26_ddtree import atomic, hashing
from k26_ddtree.errors import UserError
from k26_ddtree.hashing import sha256_file

MANIFEST_NAME = "MANIFEST.sha256"
COVERED_DIRS = ("patches", "services", "deploy/profiles", "bench", "env")
COVERED_FILES = ("REPRODUCE.md",)
# Drafter metadata is copied into the package so the manifest pins which weights were served.
MODEL_METADATA = ("SHA256SUMS", ".k26-model.json")
MODELS_DIR = "env/models"
# Byproducts of running the code, not part of what is reproduced.
_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache"}
_SKIP_SUFFIXES = (".pyc", ".pyo")
_SKIP_NAMES = {".DS_Store"}


@dataclass
class Report:
    missing: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)  # links that leave the root
    checked: int = 0

    @property
    def clean(self) -> bool:
        return not (self.missing or self.changed or self.extra or self.outside)


def check_root(root: Path) -> None:
    """UserError unless `root` is an existing folder (checked before anything is read or written)."""
    if not root.is_dir():
        problem = "is not a directory" if root.exists() else "does not exist"
        raise UserError(f"--root {root} {problem}")


def _check_name(rel: str) -> None:
    # sha256sum escapes such names with a leading backslash; refusing them keeps the format plain.
    if "\n" in rel or "\\" in rel or "\r" in rel:
        raise UserError(f"file name not representable in {MANIFEST_NAME}: {rel!r}; rename it")


def covered_files(root: Path) -> list[str]:
    """Relative POSIX paths of every file the manifest covers under root, sorted."""
    found: set[str] = set()
    for folder in COVERED_DIRS:
        base = root / folder
        if not base.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            # Hidden folders are staging areas of writers in progress (snapshot, copies).
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
            for name in filenames:
                if name in _SKIP_NAMES or name.endswith(_SKIP_SUFFIXES):
                    continue
                path = Path(dirpath, name)
                if path.is_file():
                    found.add(path.relative_to(root).as_posix())
    for name in COVERED_FILES:
        if (root / name).is_file():
            found.add(name)
    return sorted(found)


def copy_model_metadata(root: Path, model_dir: Path) -> list[str]:
    """Copy a model dir's checksum/metadata files to env/models/<name>/; returns the copied relative paths."""
    if not model_dir.is_dir():
        raise UserError(f"--model-dir {model_dir} is not a directory")
    present = [name for name in MODEL_METADATA if (model_dir / name).is_file()]
    if not present:
        raise UserError(f"--model-dir {model_dir} has none of {', '.join(MODEL_METADATA)} "
                        "(run `k26-deploy verify-model` on it first)")
    dest = root / MODELS_DIR / model_dir.resolve().name
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in present:
        atomic.write_bytes(dest / name, (model_dir / name).read_bytes())
        copied.append((dest / name).relative_to(root).as_posix())
    return copied


def render(root: Path, files: list[str], say=print) -> str:
    lines = []
    for number, rel in enumerate(files, 1):
        _check_name(rel)
        outside = hashing.link_leaving(root, rel)
        if outside is not None:
            raise UserError(f"{rel} is a link to {outside}, outside {root}: put the file itself there, "
                            "or remove the link")
        lines.append(f"{sha256_file(root / rel)}  {rel}\n")
        if number % 200 == 0:
            say(f"manifest: hashed {number}/{len(files)} files")
    return "".join(lines)


def write(root: Path, out: Path, say=print) -> int:
    """Hash every covered file under root (checked with check_root) into `out` (atomically);
    returns the number of entries."""
    files = covered_files(root)
    out_rel = _relative_to(out, root)
    files = [rel for rel in files if rel != out_rel]
    if not files:
        raise UserError(f"nothing to record under {root}: none of {', '.join(COVERED_DIRS + COVERED_FILES)} exist")
    text = render(root, files, say)
    check_out(out)
    atomic.write_text(out, text)
    return len(files)


def check_out(out: Path) -> None:
    """UserError unless `out` can become the manifest file. Nothing is created here: its missing
    folders appear only when the manifest is written, so a refused run leaves no trace."""
    if out.is_dir():
        raise UserError(f"--out {out} is a directory; give the manifest's file path")
    nearest = next(folder for folder in out.parents if folder.exists())
    if not nearest.is_dir():
        raise UserError(f"cannot write {out}: {nearest} is not a directory")
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise UserError(f"cannot write {out}: permission denied ({nearest})")


def _relative_to(path: Path, root: Path) -> str | None:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return None


def parse(manifest: Path) -> dict[str, str]:
    """Path -> hex digest from a sha256sum-format file; a malformed line is a clear error, and so
    is a manifest that lists nothing (`manifest` never writes one: it refuses an empty package)."""
    try:
        entries = hashing.read_sums(manifest)
    except FileNotFoundError:
        raise UserError(f"{manifest} not found; write it with `k26-deploy manifest`") from None
    if not entries:
        raise UserError(f"{manifest} lists no files (empty, or only blank lines and comments): "
                        "write it with `k26-deploy manifest`")
    return entries


def verify(root: Path, manifest: Path) -> Report:
    entries = parse(manifest)
    report = Report()
    for rel, digest in sorted(entries.items()):
        path = root / rel
        if hashing.link_leaving(root, rel) is not None:
            report.outside.append(rel)
        elif not path.is_file():
            report.missing.append(rel)
        elif sha256_file(path) != digest:
            report.changed.append(rel)
        else:
            report.checked += 1
    manifest_rel = _relative_to(manifest, root)
    report.extra = [rel for rel in covered_files(root) if rel not in entries and rel != manifest_rel]
    return report
