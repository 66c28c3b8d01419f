"""Where the shipped data folders are: inside the wheel, or at the top of a source checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_SOURCE_ROOT = _PACKAGE.parent


def data_path(*parts: str) -> Path:
    """Path of a shipped data folder or file, e.g. data_path("deploy", "profiles").

    An installed wheel carries the folders under k26_ddtree/_data; a source
    checkout (editable install, tests) has them at the repository root.
    """
    installed = _PACKAGE.joinpath("_data", *parts)
    if installed.exists():
        return installed
    return _SOURCE_ROOT.joinpath(*parts)


def source_root() -> Path | None:
    """The repository root when running from a checkout, else None."""
    return _SOURCE_ROOT if (_SOURCE_ROOT / "pyproject.toml").is_file() else None
