"""The real CLI on a machine without systemd, or without systemd-analyze: true messages, nothing half-written.

"Without" is a PATH that lacks the binaries (the CLI runs by absolute python
path), and, where this host's PID 1 is not systemd, the host itself.
"""

from __future__ import annotations

import json
import shutil

import pytest

from deploy_helpers import k26, one_line_error

from k26_ddtree.deploy.systemd import BOOTED_MARK

INSTALL = ("install", "--profile", "pcie-ep8", "--allow-missing-model")
# This host as it is: systemctl installed, but PID 1 is something else (a container, a CI runner).
HOST_WITHOUT_SYSTEMD = not BOOTED_MARK.is_dir() and shutil.which("systemctl") is not None
host_without_systemd = pytest.mark.skipif(not HOST_WITHOUT_SYSTEMD,
                                          reason="needs a host with systemctl whose PID 1 is not systemd")


def path_with(tmp_path, *tools: str) -> dict:
    """A PATH holding only `tools` (links to the real ones)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in tools:
        found = shutil.which(tool)
        if found is None:
            pytest.skip(f"needs {tool}")
        (bin_dir / tool).symlink_to(found)
    return {"PATH": str(bin_dir)}


def test_render_without_systemd_analyze_says_not_validated(tmp_path):
    proc = k26("render", "--profile", "pcie-ep8", "--allow-missing-model", env=path_with(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# k26-ddtree.service")
    assert proc.stderr == ("k26-deploy: warning: k26-ddtree: not validated: systemd-analyze not found "
                           "(it comes with the systemd package)\n")


def test_render_with_systemd_analyze_is_silent_on_stderr(tmp_path):
    proc = k26("render", "--profile", "pcie-ep8", "--allow-missing-model", env=path_with(tmp_path, "systemd-analyze"))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_install_root_without_systemd_analyze_says_not_validated(tmp_path):
    proc = k26(*INSTALL, "--root", str(tmp_path / "image"), env=path_with(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "not validated: systemd-analyze not found" in proc.stderr
    assert (tmp_path / "image/etc/systemd/system/k26-ddtree.service").is_file()


def test_install_without_systemctl_writes_nothing(tmp_path):
    units = tmp_path / "units"
    units.mkdir()
    message = one_line_error(k26(*INSTALL, "--unit-dir", str(units), env=path_with(tmp_path, "systemd-analyze")))
    assert message.startswith("k26-deploy: error: systemctl not found: this command needs systemd")
    assert list(units.iterdir()) == [], "no unit left behind"


@host_without_systemd
def test_install_on_a_host_whose_pid1_is_not_systemd_writes_nothing(tmp_path):
    units = tmp_path / "units"
    units.mkdir()
    message = one_line_error(k26(*INSTALL, "--unit-dir", str(units)))
    assert f"systemd is not running on this machine (no {BOOTED_MARK}" in message
    assert list(units.iterdir()) == []


@pytest.mark.parametrize("where", ["no-systemctl", pytest.param("host", marks=host_without_systemd)])
def test_status_without_systemd_is_one_line_and_json_stays_json(tmp_path, where):
    if where == "host":
        env, expected = {}, "systemd is not running on this machine"
    else:
        env, expected = path_with(tmp_path), "systemctl not found"
    plain = one_line_error(k26("status", env=env))
    assert expected in plain
    as_json = k26("status", "--json", env=env)
    assert as_json.returncode == 2 and "Traceback" not in as_json.stderr
    assert as_json.stderr.strip() == plain
    report = json.loads(as_json.stdout)
    assert report == {"unit": "k26-ddtree", "ready": False, "error": plain.removeprefix("k26-deploy: error: ")}

