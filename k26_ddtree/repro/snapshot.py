"""`k26-deploy snapshot`: record what this machine runs, one file per item plus index.json.

Every item is best effort: a missing tool is recorded as "not available", never
an error, so a snapshot can be taken on any machine (including one without GPUs
or systemd). The folder appears complete or not at all (built beside, then renamed).
"""

from __future__ import annotations

import datetime as dt
import glob
import json
import os
import platform
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from k26_ddtree import __version__, jsonread
from k26_ddtree.errors import UserError
from k26_ddtree.repro import host

UNIT = "k26-ddtree"


@dataclass(frozen=True)
class Item:
    """One recorded fact: its text, how it was obtained and whether that worked."""

    name: str
    text: str
    source: str
    status: str  # "ok", "none", "not available" or "failed"
    exit_code: int | None = None


def _from_tool(name: str, argv: list[str], timeout: float = 60.0, empty_means: str = "ok") -> Item:
    out = host.run_tool(argv, timeout=timeout)
    source = " ".join(argv)
    if not out.available:
        return Item(name, out.output, source, host.NOT_AVAILABLE)
    status = "ok" if out.exit_code == 0 else "failed"
    if status == "ok" and not out.output.strip():
        status = empty_means
    return Item(name, out.output, source, status, out.exit_code)


def _gpu_item(name: str, argv: list[str]) -> Item:
    """GPU facts read "none" on a machine without GPUs rather than an nvidia-smi error."""
    if not host.gpu_list():
        return Item(name, "none\n", " ".join(argv), "none")
    return _from_tool(name, argv)


def _os_item() -> Item:
    release = Path("/etc/os-release")
    text = release.read_text(errors="replace") if release.is_file() else f"{host.NOT_AVAILABLE}: /etc/os-release\n"
    text += f"\nuname: {' '.join(platform.uname())}\n"
    return Item("os", text, "/etc/os-release + uname", "ok")


def _kernel_item() -> Item:
    return Item("kernel", f"{platform.release()}\n{platform.version()}\n", "uname -r -v", "ok")


def _cuda_item() -> Item:
    """Every toolkit on the machine and which one is the default: a wrong default broke FlashInfer's JIT."""
    candidates = ["nvcc", "/usr/local/cuda/bin/nvcc", *sorted(glob.glob("/usr/local/cuda-*/bin/nvcc"))]
    lines = []
    found = False
    for nvcc in candidates:
        where = shutil.which(nvcc) if nvcc == "nvcc" else nvcc
        if where is None or not os.path.exists(where):
            continue
        found = True
        release = host.nvcc_release(where)
        lines.append(f"{nvcc} -> {os.path.realpath(where)}: release {release or 'unknown'}")
    if os.path.islink("/usr/local/cuda"):
        lines.append(f"/usr/local/cuda -> {os.path.realpath('/usr/local/cuda')}")
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            lines.append(f"{var}={os.environ[var]}")
    if not found:
        return Item("cuda-toolkit", f"{host.NOT_AVAILABLE}: no nvcc found\n" + "".join(f"{l}\n" for l in lines),
                    "nvcc --version", host.NOT_AVAILABLE)
    return Item("cuda-toolkit", "".join(f"{line}\n" for line in lines), "nvcc --version", "ok")


def _python_item() -> Item:
    text = (f"executable: {sys.executable}\nversion: {sys.version}\nprefix: {sys.prefix}\n"
            f"base_prefix: {sys.base_prefix}\nplatform: {platform.platform()}\n")
    return Item("python", text, "sys", "ok")


def _patchset_item() -> Item:
    """`k26-deploy apply --check` in a child process: its exit code is the state, whatever it is."""
    item = _from_tool("patchset", [sys.executable, "-m", "k26_ddtree", "apply", "--check"], timeout=300)
    if "invalid choice: 'apply'" in item.text:
        return Item(item.name, item.text, item.source, host.NOT_AVAILABLE, item.exit_code)
    if item.status == "failed":
        # A non-zero exit is a state ("applied", "foreign-modified"), not a failure to record.
        return Item(item.name, item.text, item.source, "ok", item.exit_code)
    return item


def _unit_item() -> Item:
    return _from_tool("unit", ["systemctl", "cat", UNIT], timeout=30)


def profile_from_unit(unit_text: str) -> dict | None:
    """The resolved profile `k26-deploy render` embeds in the unit as one JSON comment line, if any."""
    from k26_ddtree.deploy.units import PROFILE_MARK

    for line in unit_text.splitlines():
        if line.startswith(PROFILE_MARK):
            try:
                found = jsonread.parse_json(line[len(PROFILE_MARK):], "the unit's profile line")
            except jsonread.Unreadable:
                return None
            return found if isinstance(found, dict) else None
    return None


def _profile_item(unit: Item) -> Item:
    if unit.status != "ok":
        return Item("profile", f"none (no installed {UNIT} unit)\n", "systemctl cat", "none")
    profile = profile_from_unit(unit.text)
    if profile is None:
        return Item("profile", "unknown (the unit carries no k26-deploy profile)\n", "systemctl cat", "none")
    text = f"name: {profile.get('name', 'unknown')}\n{json.dumps(profile, indent=2, sort_keys=True)}\n"
    return Item("profile", text, "systemctl cat (embedded profile)", "ok")


def collect(say=print) -> list[Item]:
    steps = [
        ("os", _os_item), ("kernel", _kernel_item),
        ("driver", lambda: _gpu_item("driver", ["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total",
                                                "--format=csv"])),
        ("cuda-toolkit", _cuda_item),
        ("gpus", lambda: _gpu_item("gpus", ["nvidia-smi", "-L"])),
        ("topology", lambda: _gpu_item("topology", ["nvidia-smi", "topo", "-m"])),
        ("python", _python_item),
        ("pip-freeze", lambda: _from_tool("pip-freeze", [sys.executable, "-m", "pip", "freeze"], timeout=120)),
        ("patchset", _patchset_item),
        ("unit", _unit_item),
        ("service-status", lambda: _from_tool("service-status", [sys.executable, "-m", "k26_ddtree", "status"],
                                              timeout=60)),
    ]
    items: list[Item] = []
    for number, (name, read) in enumerate(steps, 1):
        say(f"snapshot: [{number}/{len(steps) + 1}] {name}")
        items.append(read())
    say(f"snapshot: [{len(steps) + 1}/{len(steps) + 1}] profile")
    items.append(_profile_item(next(item for item in items if item.name == "unit")))
    return items


def default_dir(root: Path, now: dt.datetime) -> Path:
    safe_host = re.sub(r"[^A-Za-z0-9._-]", "-", host.hostname())
    return root / "env" / "snapshots" / f"snapshot-{safe_host}-{now.strftime('%Y%m%dT%H%M%SZ')}"


def write(items: list[Item], out: Path, now: dt.datetime) -> Path:
    """Write the items and index.json into a sibling temp dir, then rename it to `out`."""
    if out.exists():
        raise UserError(f"{out} already exists; choose another --out")
    _make_parent(out)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as err:
        raise UserError(f"cannot create {out}: {err.strerror}") from None
    try:
        index = {
            "k26_ddtree_version": __version__,
            "host": host.hostname(),
            "created_utc": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "items": {},
        }
        for item in items:
            filename = f"{item.name}.txt"
            (staging / filename).write_text(item.text if item.text.endswith("\n") or not item.text else item.text + "\n")
            index["items"][item.name] = {
                "file": filename, "source": item.source, "status": item.status, "exit_code": item.exit_code,
            }
        (staging / "index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        os.chmod(staging, 0o755)
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def _make_parent(out: Path) -> None:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"cannot create {out}: {err.strerror} ({out.parent})") from None


def take(out: Path | None, root: Path, say=print) -> Path:
    now = dt.datetime.now(dt.timezone.utc)
    if out is None and not root.is_dir():
        raise UserError(f"--root {root} is not a directory")
    target = out if out is not None else default_dir(root, now)
    if target.exists():
        raise UserError(f"{target} already exists; choose another --out")
    _make_parent(target)  # before the minutes of collecting, not after
    return write(collect(say), target, now)
