"""Where the hub token comes from: the environment or a private file, never the command line."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from k26_ddtree.errors import UserError

TOKEN_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def default_token_file() -> Path:
    """The file `hf auth login` writes: $HF_TOKEN_PATH, else $HF_HOME/token, else ~/.cache/huggingface/token."""
    if os.environ.get("HF_TOKEN_PATH"):
        return Path(os.environ["HF_TOKEN_PATH"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home).expanduser() / "token"


def load_token(token_file: Path | None) -> str | None:
    """The token, or None for public repositories.

    The environment wins. An explicitly named file must exist; the default one may be absent.
    Either way a file readable by group or others is refused: a token others can read is
    already leaked.
    """
    for name in TOKEN_ENV_VARS:
        value = os.environ.get(name, "").strip()
        if value:
            return _checked(value, f"${name}")
    path = token_file if token_file is not None else default_token_file()
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if token_file is not None:
            raise UserError(f"token file {path} does not exist") from None
        return None
    if not stat.S_ISREG(mode):
        raise UserError(f"token file {path} is not a regular file")
    if mode & 0o077:
        raise UserError(f"token file {path} is accessible by group or others "
                        f"(mode {stat.S_IMODE(mode):04o}): run `chmod 600 {path}`")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"token file {path} is not text (not UTF-8)") from None
    return _checked(text.strip(), str(path)) or None


def _checked(token: str, origin: str) -> str:
    # The token goes into an HTTP header line of aria2c's input: a line break would inject options.
    if any(c.isspace() for c in token):
        raise UserError(f"the token from {origin} contains whitespace")
    return token
