"""Developer tool: regenerate the diffs, series and pins of a patch set from its full/ files.

    python -m k26_ddtree.patchset.regen [--root DIR] [--wheel PATH]

The originals are read straight out of the pinned wheel (downloaded once into
$K26_WHEEL_CACHE or .cache/wheels, and checked against the SHA256 already in
pins.json). Output is deterministic: running it twice changes nothing.
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from pathlib import Path

from k26_ddtree import atomic
from k26_ddtree.errors import UserError
from k26_ddtree.hashing import sha256_bytes, sha256_file
from k26_ddtree.patchset.pins import (FULL_DIR, PINS_FILE, SERIES_FILE, SGLANG_VERSION, FilePin, WheelPin,
                                      default_root, diff_name, dump_pins, read_wheel_pin)
from k26_ddtree.patchset.udiff import make_diff
from k26_ddtree.patchset.wheel import pinned_wheel


def full_files(root: Path) -> list[str]:
    """Paths (under the site dir, posix) of the full patched files in a patch set."""
    full = root / FULL_DIR
    if not full.is_dir():
        return []
    return sorted(
        path.relative_to(full).as_posix()
        for path in full.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    )


def generated(root: Path, wheel: Path, wheel_pin: WheelPin, out=print) -> dict[str, bytes]:
    """{file name in root: bytes} for every generated file: the diffs, series and pins.json.

    A full/ file still identical to the pristine one (copied in, not yet edited)
    is no part of the patch set; it is named and skipped.
    """
    outputs: dict[str, bytes] = {}
    pins = []
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for rel in full_files(root):
            if not rel.startswith("sglang/"):
                raise UserError(f"{root / FULL_DIR / rel}: full/ holds files of the sglang package only (full/sglang/...)")
            patched = (root / FULL_DIR / rel).read_bytes()
            original = archive.read(rel) if rel in names else None
            if original == patched:
                out(f"skipping {FULL_DIR}/{rel}: identical to the pristine file")
                continue
            outputs[diff_name(rel)] = make_diff(original, patched, rel)
            pins.append(FilePin(rel, sha256_bytes(original) if original is not None else None, sha256_bytes(patched)))
    outputs[SERIES_FILE] = "".join(diff_name(pin.rel) + "\n" for pin in pins).encode()
    outputs[PINS_FILE] = dump_pins(SGLANG_VERSION, wheel_pin, pins)
    return outputs


def write(root: Path, outputs: dict[str, bytes]) -> list[str]:
    """Write the outputs, drop diffs no longer in the series; the names that changed."""
    changed = []
    for name, data in sorted(outputs.items()):
        path = root / name
        if not (path.is_file() and path.read_bytes() == data):
            atomic.replace(path, data)
            changed.append(name)
    for stale in sorted(root.glob("*.diff")):
        if stale.name not in outputs:
            stale.unlink()
            changed.append(f"{stale.name} (removed)")
    return changed


def regenerate(root: Path, wheel: Path | None = None, out=print) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    pin = read_wheel_pin(root)
    if wheel is None:
        wheel = pinned_wheel(pin)
    elif pin is not None and sha256_file(wheel) != pin.sha256:
        raise UserError(f"{wheel} does not match the wheel SHA256 pinned in {root / PINS_FILE}")
    wheel_pin = pin or WheelPin(wheel.name, sha256_file(wheel))
    outputs = generated(root, wheel, wheel_pin, out)
    changed = write(root, outputs)
    count = len(outputs) - 2
    out(f"{root}: {count} patched file(s); " + (f"updated {', '.join(changed)}" if changed else "nothing changed"))
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m k26_ddtree.patchset.regen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=None, help="patch set directory (default: patches/sglang-0.5.11)")
    parser.add_argument("--wheel", type=Path, default=None, help="the pinned sglang wheel (default: download/cached)")
    args = parser.parse_args(argv)
    try:
        regenerate(args.root or default_root(), args.wheel)
    except UserError as err:
        print(f"regen: error: {err}", file=sys.stderr)
        return err.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
