"""The patch set on disk: pins.json, the series, the per-file diffs.

Layout of a patch set root (patches/sglang-VERSION/):
  series       one diff file name per line, in apply order
  <name>.diff  one unified diff per SGLang file (a/sglang/... b/sglang/...); a file the
               patch set adds is a diff from /dev/null
  pins.json    SGLang version, pinned wheel, and the SHA256 of every original and patched
               file (original_sha256 is null for a file the patch adds)

The diffs are the patch set: a patched file is its pinned original with its diff applied
exactly (udiff.py), and is used only when it hashes as its patched_sha256.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from k26_ddtree import paths
from k26_ddtree.errors import UserError
from k26_ddtree.hashing import sha256_bytes
from k26_ddtree.patchset import validate
from k26_ddtree.patchset.udiff import PatchError, apply_diff
from k26_ddtree.repro import sglang_versions
from k26_ddtree.resources import data_path

# The SGLang version whose patch set the developer tool (regen) and the tests use when none is
# named: the one the install paths install by default. `k26-deploy apply` never uses it: it takes
# the patch set of the installed version.
DEFAULT_VERSION = sglang_versions.DEFAULT
PINS_FILE = "pins.json"
SERIES_FILE = "series"
REGEN = "python -m k26_ddtree.patchset.regen"
# Far more than a diff of any SGLang file; a larger one is read by mistake.
MAX_DIFF_BYTES = 64 * paths.MB
_WHEEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*\.whl")


def patches_folder() -> Path:
    """The shipped patch sets' folder: patches/ of the checkout, or the wheel's copy of it."""
    return data_path("patches")


def default_root() -> Path:
    return patches_folder() / f"sglang-{DEFAULT_VERSION}"


def _version_key(version: str) -> tuple:
    """Numbers as numbers, anything else after them as text: sorts any two version strings."""
    return tuple((0, int(part), "") if part.isascii() and part.isdigit() else (1, 0, part)
                 for part in re.split(r"[.+-]", version))


def shipped_versions(patches: Path | None = None) -> list[str]:
    """The SGLang versions with a patch set in `patches` (default: the shipped ones), that is a
    sglang-VERSION/pins.json there; oldest first."""
    folders = (patches if patches is not None else patches_folder()).glob("sglang-*")
    return sorted((f.name[len("sglang-"):] for f in folders if (f / PINS_FILE).is_file()), key=_version_key)


def root_for(version: str, patches: Path | None = None) -> Path:
    """The patch set in `patches` (default: the shipped ones) for an installed SGLang `version`;
    UserError naming the versions there are patch sets for when it has none."""
    try:
        validate.version(version, "the installed sglang version")
    except validate.Invalid as err:
        raise UserError(f"{err}; nothing changed") from None
    patches = patches if patches is not None else patches_folder()
    root = patches / f"sglang-{version}"
    if not (root / PINS_FILE).is_file():
        known = shipped_versions(patches)
        has = f"it has patch sets for sglang {', '.join(known)}" if known else "it has none"
        raise UserError(f"sglang {version} is installed and k26-ddtree has no patch set for it ({has}); install "
                        "one of those, or name a patch set with --patch-set; nothing changed")
    return root


def diff_name(rel: str) -> str:
    """The diff file name for a patched file: sglang/srt/server_args.py -> sglang.srt.server_args.diff."""
    stem = rel[:-3] if rel.endswith(".py") else rel
    return stem.replace("/", ".") + ".diff"


@dataclass(frozen=True)
class FilePin:
    rel: str                      # path under the site dir, e.g. sglang/srt/server_args.py
    original_sha256: str | None   # None: the patch set adds this file
    patched_sha256: str


@dataclass(frozen=True)
class WheelPin:
    sglang_version: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class PatchSet:
    root: Path
    wheel: WheelPin
    files: tuple[FilePin, ...]

    @property
    def sglang_version(self) -> str:
        return self.wheel.sglang_version

    def diff_file(self, rel: str) -> Path:
        return self.root / diff_name(rel)

    def diff_bytes(self, pin: FilePin) -> bytes:
        path = self.diff_file(pin.rel)
        try:
            return paths.read_input(path, f"the diff {path}", MAX_DIFF_BYTES)
        except FileNotFoundError:
            raise UserError(f"the patch set at {self.root} is incomplete: {path.name} (the diff of {pin.rel}) "
                            "is missing; nothing changed") from None

    def patched_bytes(self, pin: FilePin, original: bytes | None) -> bytes:
        """The patched file: `original` (the pinned original; None for a file the patch adds) with
        its diff applied, refused unless it hashes as pins.json says."""
        name = diff_name(pin.rel)
        try:
            patched = apply_diff(original, self.diff_bytes(pin))
        except PatchError as err:
            raise UserError(f"the patch set at {self.root} is inconsistent: {name} does not apply to the pinned "
                            f"original of {pin.rel} ({err}); nothing changed") from None
        if sha256_bytes(patched) != pin.patched_sha256:
            raise UserError(f"the patch set at {self.root} is inconsistent: {name} applied to the pinned original "
                            f"of {pin.rel} does not give the patched_sha256 in {PINS_FILE}; nothing changed")
        return patched


def load(root: Path) -> PatchSet:
    """Read a patch set's pins; a clear error when it has none, none of its files, or a pins file
    that is not one (validate.py: every path must lie inside sglang/, checked before anything is
    staged)."""
    root = Path(root)
    pins_path = root / PINS_FILE
    if not pins_path.is_file():
        raise UserError(f"no patch set at {root}: it has no {PINS_FILE}")
    try:
        raw = validate.fields(validate.read_json(pins_path), "the top level", {"sglang_version", "wheel", "files"})
        pins = []
        for rel, entry in sorted(validate.mapping(raw["files"], "'files'").items()):
            validate.sglang_path(rel, "the 'files' entry")
            where = f"files[{validate.shown(rel)}]"
            validate.fields(entry, where, {"original_sha256", "patched_sha256"})
            original = validate.sha256(entry["original_sha256"], f"{where}.original_sha256", nullable=True)
            pins.append(FilePin(rel, original, validate.sha256(entry["patched_sha256"], f"{where}.patched_sha256")))
        patch_set = PatchSet(root, _wheel_pin(raw), tuple(pins))
    except validate.Invalid as err:
        raise UserError(f"{pins_path} is not a valid pins file: {err}") from None
    if not patch_set.files:
        raise UserError(f"the patch set at {root} has no files; make them with {REGEN} --from DIR")
    return patch_set


def _wheel_pin(raw: dict) -> WheelPin:
    version = validate.version(raw["sglang_version"], "'sglang_version'")
    wheel = validate.fields(raw["wheel"], "'wheel'", {"filename", "sha256"})
    filename = wheel["filename"]
    # The name is joined to the wheel cache folder: a bare file name only.
    if not (isinstance(filename, str) and _WHEEL_NAME.fullmatch(filename)):
        raise validate.Invalid(f"wheel.filename is {validate.shown(filename)}, not the file name of a wheel")
    return WheelPin(version, filename, validate.sha256(wheel["sha256"], "wheel.sha256"))


def dump_pins(wheel: WheelPin, files: list[FilePin]) -> bytes:
    """pins.json bytes, stable (sorted keys, fixed indent) so regenerating changes nothing."""
    doc = {
        "sglang_version": wheel.sglang_version,
        "wheel": {"filename": wheel.filename, "sha256": wheel.sha256},
        "files": {
            pin.rel: {"original_sha256": pin.original_sha256, "patched_sha256": pin.patched_sha256}
            for pin in files
        },
    }
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def read_wheel_pin(root: Path) -> WheelPin | None:
    """The version and wheel a patch set is pinned to, or None when it has no pins.json yet
    (regen needs them before any file is pinned)."""
    pins_path = Path(root) / PINS_FILE
    if not pins_path.is_file():
        return None
    try:
        raw = validate.mapping(validate.read_json(pins_path), "the top level")
        for name in ("sglang_version", "wheel"):
            if name not in raw:
                raise validate.Invalid(f"the top level lacks the field {name!r}")
        return _wheel_pin(raw)
    except validate.Invalid as err:
        raise UserError(f"{pins_path} is not a valid pins file: {err}") from None
