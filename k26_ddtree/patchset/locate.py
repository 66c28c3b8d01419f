"""Find an SGLang installation and its version without importing it.

Importing sglang would execute its __init__ (and pull in torch); the patch
tool must work on a broken or half-installed environment too, so it only
reads files: the package directory from importlib's finder, the version from
the dist-info beside it, or from sglang/_version.py when a trimmed copy has no
dist-info.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from k26_ddtree.errors import UserError

_VERSION_ASSIGN = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)


@dataclass(frozen=True)
class Installation:
    site: Path           # the directory that holds the `sglang` package
    version: str
    version_source: str  # where the version was read, for the progress line

    @property
    def package(self) -> Path:
        return self.site / "sglang"


def _is_sglang_package(path: Path) -> bool:
    return (path / "__init__.py").is_file() and (path / "srt").is_dir()


def site_from_dir(given: str | Path) -> Path:
    """The site dir for --sglang-dir, which may name the `sglang` package or the dir holding it."""
    path = Path(given).expanduser().absolute()
    if _is_sglang_package(path / "sglang"):
        return path
    if path.name == "sglang" and _is_sglang_package(path):
        return path.parent
    raise UserError(f"no sglang package at {path} (give the sglang package dir or the dir that holds it)")


def site_from_finder() -> Path:
    """The site dir of the sglang this Python would import (find_spec of a top-level name runs no code)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("sglang is not importable from this Python; install it or pass --sglang-dir PATH")
    for location in spec.submodule_search_locations:
        if _is_sglang_package(Path(location)):
            return Path(location).parent
    raise UserError(f"sglang at {list(spec.submodule_search_locations)} has no srt/ package; pass --sglang-dir PATH")


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _metadata_field(metadata: Path, field: str) -> str | None:
    with open(metadata, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if not line.strip():
                break  # the headers end at the first blank line; the long description follows
            key, _, value = line.partition(":")
            if key.strip().lower() == field.lower():
                return value.strip()
    return None


def _dist_info_versions(site: Path) -> dict[str, str]:
    """{dist-info dir name: version} for every sglang distribution recorded in `site`."""
    found = {}
    for dist_info in sorted(site.glob("*.dist-info")):
        metadata = dist_info / "METADATA"
        if not metadata.is_file():
            continue
        name = _metadata_field(metadata, "Name")
        version = _metadata_field(metadata, "Version")
        if name is not None and version is not None and _normalized(name) == "sglang":
            found[dist_info.name] = version
    return found


def _source_version(package: Path) -> tuple[str, str] | None:
    for name in ("_version.py", "version.py"):
        path = package / name
        if path.is_file():
            match = _VERSION_ASSIGN.search(path.read_text(encoding="utf-8", errors="replace"))
            if match:
                return match.group(1), name
    return None


def read_version(site: Path) -> tuple[str, str]:
    """(version, where it was read) for the sglang package in `site`."""
    versions = _dist_info_versions(site)
    if len(set(versions.values())) > 1:
        listing = ", ".join(f"{name} says {version}" for name, version in versions.items())
        raise UserError(f"{site} records several sglang versions ({listing}); remove the stale dist-info")
    if versions:
        name, version = next(iter(versions.items()))
        return version, name
    from_source = _source_version(site / "sglang")
    if from_source is None:
        raise UserError(f"cannot tell the sglang version in {site}: no sglang dist-info and no version in sglang/_version.py")
    version, name = from_source
    return version, f"sglang/{name} (no sglang dist-info beside the package)"


def locate(sglang_dir: str | Path | None = None) -> Installation:
    site = site_from_dir(sglang_dir) if sglang_dir is not None else site_from_finder()
    version, source = read_version(site)
    return Installation(site=site, version=version, version_source=source)
