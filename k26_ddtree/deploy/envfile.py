"""The unit's EnvironmentFile: where the API key lives (mode 0600, never in the unit or argv of ours)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from k26_ddtree.deploy.schema import Profile
from k26_ddtree.errors import UserError

API_KEY_VAR = "K26_API_KEY"


def check_env_file(profile: Profile, root: Path | None = None) -> None:
    """Refuse an env file others can read, one that is not a text file, and a missing key when the profile asks for one."""
    path = _located(profile, root)
    if path.exists():
        if not path.is_file():
            raise UserError(f"env_file {path} is not a regular file (a directory?); systemd reads NAME=value lines from it")
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise UserError(f"{path} is mode {mode:o}; it may hold secrets, make it 0600: chmod 600 {path}")
    if not profile.api_key:
        return
    if not path.exists() or API_KEY_VAR not in read_env_file(path):
        raise UserError(
            f"profile {profile.name} sets api_key: true but {path} has no {API_KEY_VAR}; create it: "
            f"install -D -m 600 /dev/null {path} && echo '{API_KEY_VAR}=<your key>' >> {path}"
        )


def api_key_for(profile: Profile) -> str | None:
    """The key clients of this service must send: $K26_API_KEY, else the unit's env file."""
    if not profile.api_key:
        return None
    if os.environ.get(API_KEY_VAR):
        return os.environ[API_KEY_VAR]
    try:
        return read_env_file(Path(profile.env_file)).get(API_KEY_VAR)
    except UserError:
        return None


def read_env_file(path: Path) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        # systemd itself skips lines that are not UTF-8, so the key would silently not reach the server.
        raise UserError(f"env_file {path} is not UTF-8 text; write it as NAME=value lines in UTF-8") from None
    except OSError as err:
        raise UserError(f"cannot read env_file {path}: {err.strerror or err}") from None
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def _located(profile: Profile, root: Path | None) -> Path:
    path = Path(profile.env_file)
    return root / path.relative_to("/") if root else path
