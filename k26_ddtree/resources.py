"""Where the shipped data folders are: inside the wheel, or at the top of a source checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_SOURCE_ROOT = _PACKAGE.parent

# What the toolkit reads at run time, as paths from the repository root. The wheel carries
# exactly these (pyproject.toml's force-include, which a test holds to this list), and so does
# the offline bundle: never results, the proving ground or the environment scripts.
SHIPPED_DATA = (("patches",), ("deploy", "profiles"), ("services",), ("bench", "coding_tasks.yaml"))


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
