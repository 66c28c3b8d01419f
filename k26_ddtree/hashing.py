"""SHA-256 of files and folders, the one digest every record of this toolkit uses (pins, manifests,
model folders, bundles), and the `sha256sum` lists that carry them (MANIFEST.sha256, SHA256SUMS)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from k26_ddtree.errors import UserError

_CHUNK = 8 << 20  # large reads: model shards are hashed at disk speed

_SUMS_LINE = re.compile(r"([0-9a-fA-F]{64}) [ *](.+)")  # text ("  ") or binary (" *") mode


@dataclass(frozen=True)
class Digests:
    size: int
    sha256: str
    git_oid: str | None


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    return file_digests(path).sha256


def file_digests(path: Path, with_git_oid: bool = False,
                 on_bytes: Callable[[int], None] | None = None) -> Digests:
    """SHA-256 (and the git blob id, which the hub lists for small files) of `path` in one pass;
    `on_bytes(n)` is called after each chunk (for progress)."""
    sha256 = hashlib.sha256()
    size = path.stat().st_size
    git = None
    if with_git_oid:
        git = hashlib.sha1()  # git's object id, not a security choice: the hub lists it
        git.update(b"blob %d\0" % size)
    buffer = bytearray(min(_CHUNK, size + 1))  # small files (manifests hash thousands) stay cheap
    view = memoryview(buffer)
    read_total = 0
    with open(path, "rb") as handle:
        while True:
            n = handle.readinto(buffer)
            if not n:
                break
            sha256.update(view[:n])
            if git is not None:
                git.update(view[:n])
            read_total += n
            if on_bytes is not None:
                on_bytes(n)
    if git is not None and read_total != size:
        git = None  # the file changed while hashing; the size check will report it
    return Digests(size=read_total, sha256=sha256.hexdigest(),
                   git_oid=git.hexdigest() if git is not None else None)


def tree_digest(root: Path, pattern: str = "*") -> str | None:
    """SHA-256 over the files under `root` whose names match `pattern` (relative path and content):
    equal digests, same files. None when `root` is no folder. __pycache__ is left out: the
    interpreter writes there on its own."""
    if not root.is_dir():
        return None
    digest = hashlib.sha256()
    for item in sorted(root.rglob(pattern)):
        rel = item.relative_to(root)
        if item.is_file() and "__pycache__" not in rel.parts:
            digest.update(rel.as_posix().encode() + b"\0" + bytes.fromhex(sha256_file(item)))
    return digest.hexdigest()


def parse_sums(text: str, source: str | Path) -> dict[str, str]:
    """Relative path -> lower-case hex digest from `sha256sum` output, read as `sha256sum -c
    --strict` reads it: empty lines and `#` comments are skipped, a CR before the newline is
    dropped, any other line that is not `HEX  PATH` (or `HEX *PATH`) is an error. So are an
    absolute path or one with `..`, and a path listed twice (it would count as two files)."""
    entries: dict[str, str] = {}
    first_seen: dict[str, int] = {}
    for number, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if not line or line.startswith("#"):
            continue
        match = _SUMS_LINE.fullmatch(line)
        if not match:
            raise UserError(f"{source}:{number}: not a sha256sum line: {line[:80]!r}")
        rel = match.group(2)
        if rel.startswith("/") or ".." in rel.split("/"):
            raise UserError(f"{source}:{number}: {rel!r} is not a path inside the root")
        if rel in entries:
            raise UserError(f"{source}:{number}: {rel} listed twice (first on line {first_seen[rel]})")
        entries[rel] = match.group(1).lower()
        first_seen[rel] = number
    return entries


def read_sums(path: Path) -> dict[str, str]:
    """parse_sums() of the file at `path`. FileNotFoundError when it is absent (the caller says
    which command writes it); an unreadable or binary file is a UserError."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise
    except UnicodeDecodeError:
        raise UserError(f"{path} is not a sha256sum file (not UTF-8 text)") from None
    except OSError as err:
        raise UserError(f"cannot read {path}: {err.strerror}") from None
    return parse_sums(text, path)


def link_leaving(root: Path, rel: str) -> Path | None:
    """Where root/rel really is when a symbolic link takes it out of `root`; None while it stays
    inside. A listed file that is a link to /etc/passwd must not pass as a file of the tree."""
    real = (root / rel).resolve()
    return None if real.is_relative_to(root.resolve()) else real
