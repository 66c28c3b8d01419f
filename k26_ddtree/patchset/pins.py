"""The patch set on disk: pins.json, the full patched files, the per-file diffs.

Layout of a patch set root (patches/sglang-0.5.11/):
  series       one diff file name per line, in apply order
  <name>.diff  one unified diff per SGLang file (a/sglang/... b/sglang/...)
  full/...     the full patched files, at their path under the site dir
  pins.json    SGLang version, pinned wheel, and the SHA256 of every original
               and patched file (original_sha256 is null for a file the patch adds)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from k26_ddtree.errors import UserError
from k26_ddtree.hashing import sha256_bytes
from k26_ddtree.patchset import validate
from k26_ddtree.resources import data_path

SGLANG_VERSION = "0.5.11"
PINS_FILE = "pins.json"
SERIES_FILE = "series"
FULL_DIR = "full"
REGEN_HINT = "python -m k26_ddtree.patchset.regen"
_WHEEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*\.whl")


def default_root() -> Path:
    return data_path("patches", f"sglang-{SGLANG_VERSION}")


def _version_key(version: str) -> tuple:
    """Numbers as numbers, anything else after them as text: sorts any two version strings."""
    return tuple((0, int(part), "") if part.isascii() and part.isdigit() else (1, 0, part)
                 for part in re.split(r"[.+-]", version))


def shipped_versions() -> list[str]:
    """The SGLang versions with a shipped patch set (patches/sglang-VERSION/pins.json), oldest first."""
    folders = data_path("patches").glob("sglang-*")
    return sorted((f.name[len("sglang-"):] for f in folders if (f / PINS_FILE).is_file()), key=_version_key)


def root_for(version: str) -> Path:
    """The shipped patch set for an installed SGLang `version`; UserError naming the versions
    there are patch sets for when it has none."""
    try:
        validate.version(version, "the installed sglang version")
    except validate.Invalid as err:
        raise UserError(f"{err}; nothing changed") from None
    root = data_path("patches") / f"sglang-{version}"
    if not (root / PINS_FILE).is_file():
        known = shipped_versions()
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
    filename: str
    sha256: str


@dataclass(frozen=True)
class PatchSet:
    root: Path
    sglang_version: str
    wheel: WheelPin
    files: tuple[FilePin, ...]

    def full_file(self, rel: str) -> Path:
        return self.root / FULL_DIR / rel

    def diff_file(self, rel: str) -> Path:
        return self.root / diff_name(rel)

    def patched_bytes(self, pin: FilePin) -> bytes:
        """The full patched file, refused unless it matches its pin (full/ edited without regen)."""
        path = self.full_file(pin.rel)
        if not path.is_file():
            raise UserError(f"patch set is incomplete: {path} is missing; run {REGEN_HINT}")
        data = path.read_bytes()
        if sha256_bytes(data) != pin.patched_sha256:
            raise UserError(f"patch set is inconsistent: {path} does not match {PINS_FILE}; run {REGEN_HINT}")
        return data


def load(root: Path | None = None) -> PatchSet:
    """Read a patch set's pins; a clear error when it was never generated, is empty, or is not
    a pins file (validate.py: every path must lie inside sglang/, checked before anything is
    staged)."""
    root = Path(root) if root is not None else default_root()
    pins_path = root / PINS_FILE
    if not pins_path.is_file():
        raise UserError(f"no patch set at {root} ({PINS_FILE} missing); generate it with {REGEN_HINT}")
    try:
        raw = validate.fields(validate.read_json(pins_path), "the top level", {"sglang_version", "wheel", "files"})
        pins = []
        for rel, entry in sorted(validate.mapping(raw["files"], "'files'").items()):
            validate.sglang_path(rel, "the 'files' entry")
            where = f"files[{validate.shown(rel)}]"
            validate.fields(entry, where, {"original_sha256", "patched_sha256"})
            original = validate.sha256(entry["original_sha256"], f"{where}.original_sha256", nullable=True)
            pins.append(FilePin(rel, original, validate.sha256(entry["patched_sha256"], f"{where}.patched_sha256")))
        version = validate.version(raw["sglang_version"], "'sglang_version'")
        patch_set = PatchSet(root, version, _wheel_pin(raw["wheel"]), tuple(pins))
    except validate.Invalid as err:
        raise UserError(f"{pins_path} is not a valid pins file: {err}") from None
    if not patch_set.files:
        raise UserError(f"the patch set at {root} has no files; put full patched files under full/ and run {REGEN_HINT}")
    return patch_set


def _wheel_pin(raw: object) -> WheelPin:
    validate.fields(raw, "'wheel'", {"filename", "sha256"})
    filename = raw["filename"]
    # The name is joined to the wheel cache folder: a bare file name only.
    if not (isinstance(filename, str) and _WHEEL_NAME.fullmatch(filename)):
        raise validate.Invalid(f"wheel.filename is {validate.shown(filename)}, not the file name of a wheel")
    return WheelPin(filename, validate.sha256(raw["sha256"], "wheel.sha256"))


def dump_pins(sglang_version: str, wheel: WheelPin, files: list[FilePin]) -> bytes:
    """pins.json bytes, stable (sorted keys, fixed indent) so regenerating changes nothing."""
    doc = {
        "sglang_version": sglang_version,
        "wheel": {"filename": wheel.filename, "sha256": wheel.sha256},
        "files": {
            pin.rel: {"original_sha256": pin.original_sha256, "patched_sha256": pin.patched_sha256}
            for pin in files
        },
    }
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def read_wheel_pin(root: Path) -> WheelPin | None:
    """The wheel pin alone (regen needs it before any file is pinned)."""
    pins_path = Path(root) / PINS_FILE
    if not pins_path.is_file():
        return None
    try:
        raw = validate.mapping(validate.read_json(pins_path), "the top level")
        if "wheel" not in raw:
            raise validate.Invalid("the top level lacks the field 'wheel'")
        return _wheel_pin(raw["wheel"])
    except validate.Invalid as err:
        raise UserError(f"{pins_path} is not a valid pins file: {err}") from None
