"""Developer tool: edit a patch set as patched files, keep it as diffs.

A patch set (patches/sglang-VERSION/) holds only diffs, series and pins.json. To change it:

    python -m k26_ddtree.patchset.regen --expand DIR    # DIR/sglang/...: the patched files
    (edit, add or reset files under DIR/sglang/)
    python -m k26_ddtree.patchset.regen --from DIR      # the diffs, series, pins.json again

--expand writes each pinned original with its diff applied (checked against its patched SHA256)
into DIR, which must be absent or empty. --from diffs every file under DIR/sglang/ against the
pinned wheel: a file that differs becomes a diff (a file the wheel lacks, an added file), a
file identical to the wheel's is named and left out, and diffs of files no longer under DIR
are removed. Both take the SGLang version and wheel from PATCH_SET/pins.json (--root; default
the patch set of pins.DEFAULT_VERSION); the wheel is downloaded once into $K26_WHEEL_CACHE or
.cache/wheels and checked against its SHA256, or given with --wheel. A new patch set folder (no pins.json
yet) takes --version and --wheel with --from. Output is deterministic: running --from twice,
or --expand then --from on the untouched tree, changes nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from k26_ddtree import atomic
from k26_ddtree.errors import UserError
from k26_ddtree.hashing import sha256_bytes, sha256_file
from k26_ddtree.patchset import validate
from k26_ddtree.patchset.pins import (PINS_FILE, REGEN, SERIES_FILE, FilePin, PatchSet, WheelPin, default_root,
                                      diff_name, dump_pins, load, read_wheel_pin)
from k26_ddtree.patchset.udiff import make_diff
from k26_ddtree.patchset.wheel import check_is_sglang, pinned_wheel

PACKAGE = "sglang"
# What patch, editors and Python leave beside a file; never part of a patch set.
_LEFTOVER_SUFFIXES = (".orig", ".rej", ".pyc", ".swp", ".bak", "~")


def tree_files(tree: Path) -> list[str]:
    """Paths (under the site dir, posix) of the files under tree/sglang/, __pycache__ aside."""
    package = tree / PACKAGE
    if not package.is_dir():
        raise UserError(f"{tree} has no {PACKAGE}/ folder: --from takes the folder that holds {PACKAGE}/ "
                        "(as --expand writes it)")
    found = []
    for path in sorted(package.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        rel = path.relative_to(tree).as_posix()
        if path.name.startswith(".") or path.name.endswith(_LEFTOVER_SUFFIXES):
            raise UserError(f"{path} looks like a leftover (a hidden, backup or reject file), not a file of "
                            f"{PACKAGE}: delete it")
        found.append(rel)
    return found


def generated(tree: Path, wheel: Path, pin: WheelPin, out=print) -> dict[str, bytes]:
    """{file name in the patch set: bytes} for the diffs, series and pins.json of `tree`."""
    outputs: dict[str, bytes] = {}
    pins = []
    skipped = []
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for rel in tree_files(tree):
            patched = (tree / rel).read_bytes()
            original = archive.read(rel) if rel in names else None
            if original == patched:
                skipped.append(rel)
                continue
            name = diff_name(rel)
            if name in outputs:
                raise UserError(f"two files under {tree} share the diff name {name}; rename one")
            if original is None:
                out(f"{rel}: not in {wheel.name}, so the patch set adds it")
            outputs[name] = make_diff(original, patched, rel)
            pins.append(FilePin(rel, sha256_bytes(original) if original is not None else None, sha256_bytes(patched)))
    if skipped:
        out(f"left out {len(skipped)} file(s) identical to {wheel.name}'s: {', '.join(skipped)}")
    if not pins:
        raise UserError(f"no file under {tree / PACKAGE} differs from {wheel.name}'s: that is no patch set; "
                        "nothing written")
    outputs[SERIES_FILE] = "".join(diff_name(p.rel) + "\n" for p in pins).encode()
    outputs[PINS_FILE] = dump_pins(pin, pins)
    return outputs


def write(root: Path, outputs: dict[str, bytes]) -> list[str]:
    """Write the outputs, drop diffs no longer in the series; the names that changed."""
    changed = []
    for name, data in sorted(outputs.items()):
        path = root / name
        if not (path.is_file() and path.read_bytes() == data):
            atomic.write_bytes(path, data)
            changed.append(name)
    for stale in sorted(root.glob("*.diff")):
        if stale.name not in outputs:
            stale.unlink()
            changed.append(f"{stale.name} (removed)")
    return changed


def _pinned(root: Path, wheel: Path | None, version: str | None) -> tuple[Path, WheelPin]:
    """The wheel to diff against and its pin: root's pins.json, or for a new patch set --version
    and --wheel."""
    pin = read_wheel_pin(root)
    if pin is None:
        if version is None or wheel is None:
            raise UserError(f"{root} has no {PINS_FILE}: a new patch set needs --version and --wheel")
        try:
            validate.version(version, "--version")
        except validate.Invalid as err:
            raise UserError(str(err)) from None
        check_is_sglang(wheel, version)
        return wheel, WheelPin(version, wheel.name, sha256_file(wheel))
    if version is not None and version != pin.sglang_version:
        raise UserError(f"--version {version}, but {root / PINS_FILE} pins sglang {pin.sglang_version}")
    if wheel is None:
        return pinned_wheel(pin), pin
    if sha256_file(wheel) != pin.sha256:
        raise UserError(f"{wheel} does not match the wheel SHA256 pinned in {root / PINS_FILE}")
    return wheel, pin


def regenerate(root: Path, tree: Path, wheel: Path | None = None, version: str | None = None,
               out=print) -> list[str]:
    """--from: the diffs, series and pins.json of `root`, from the patched files under `tree`."""
    wheel, pin = _pinned(root, wheel, version)
    outputs = generated(tree, wheel, pin, out)
    root.mkdir(parents=True, exist_ok=True)
    changed = write(root, outputs)
    count = len(outputs) - 2
    out(f"{root}: {count} patched file(s) for sglang {pin.sglang_version}; "
        + (f"updated {', '.join(changed)}" if changed else "nothing changed"))
    return changed


def _write_patched(patch_set: PatchSet, wheel: Path, dest: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for pin in patch_set.files:
            original = archive.read(pin.rel) if pin.rel in names else None
            if (sha256_bytes(original) if original is not None else None) != pin.original_sha256:
                raise UserError(f"{wheel.name}'s {pin.rel} is not the original pinned in {patch_set.root / PINS_FILE}")
            path = dest / pin.rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(patch_set.patched_bytes(pin, original))


def expand(root: Path, dest: Path, wheel: Path | None = None, out=print) -> None:
    """--expand: the patched files of `root` under dest/sglang/, written whole or not at all."""
    if dest.is_symlink() or (dest.exists() and not (dest.is_dir() and not any(dest.iterdir()))):
        raise UserError(f"{dest} is not an empty folder; --expand writes only into a new or empty one")
    patch_set = load(root)
    wheel, _ = _pinned(root, wheel, None)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=atomic.TMP_SUFFIX))
    except OSError as err:
        raise UserError(f"cannot write {dest}: {err.strerror or err}; nothing written") from None
    try:
        _write_patched(patch_set, wheel, scratch)
        os.rename(scratch, dest)  # replaces an empty folder too
    except OSError as err:
        raise UserError(f"cannot write {dest}: {err.strerror or err}; nothing written") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out(f"{dest}: {len(patch_set.files)} patched file(s) of sglang {patch_set.sglang_version} under {PACKAGE}/; "
        f"after editing them: {REGEN} --root {root} --from {dest}")


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, exit 2, like every other refusal."""

    def error(self, message: str) -> None:
        self.exit(2, f"regen: error: {message} (see `{REGEN} --help`)\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog=REGEN, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--expand", metavar="DIR", type=Path,
                      help="write the patched files into DIR/sglang/ (DIR absent or empty)")
    mode.add_argument("--from", dest="tree", metavar="DIR", type=Path,
                      help="rewrite the diffs, series and pins.json from the patched files under DIR/sglang/")
    parser.add_argument("--root", metavar="PATCH_SET", type=Path, default=None,
                        help=f"the patch set folder (default: {default_root()})")
    parser.add_argument("--wheel", type=Path, default=None,
                        help="the pinned sglang wheel (default: downloaded once into the wheel cache)")
    parser.add_argument("--version", default=None,
                        help="the sglang version of a new patch set (with --from and --wheel)")
    args = parser.parse_args(argv)
    root = args.root or default_root()
    try:
        if args.expand is not None:
            if args.version is not None:
                parser.error("--version names a new patch set's version; --expand reads it from pins.json")
            expand(root, args.expand, args.wheel)
        else:
            regenerate(root, args.tree, args.wheel, args.version)
    except UserError as err:
        print(f"regen: error: {err}", file=sys.stderr)
        return err.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
