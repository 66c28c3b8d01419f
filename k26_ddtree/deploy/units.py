"""Render systemd units from a profile, read the profile back out of a unit, verify units.

The resolved profile is embedded in the unit as one JSON comment line, so the
installed unit file is the single record of what runs: `status` and
`reconfigure` read it back, and a last-good copy of the unit is a complete
rollback target.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jinja2

from k26_ddtree.deploy.exposure import open_port_comment
from k26_ddtree.deploy.flags import API_KEY_REFERENCE, ROUTER_PACKAGE, Flag, router_flags, server_flags
from k26_ddtree.deploy.profiles import profile_from_json, to_json
from k26_ddtree.deploy.schema import Profile
from k26_ddtree.errors import UserError
from k26_ddtree.resources import data_path

SERVICE_UNIT = "k26-ddtree"
ROUTER_UNIT = "k26-ddtree-router"
PROFILE_MARK = "# k26-ddtree-profile: "
NOT_VALIDATED = "not validated: systemd-analyze not found"
# Shell-like words systemd would otherwise split, or treat as a separator (a lone ";").
_NEEDS_QUOTES = set(' \t"\'\\;')
# Slack for python start-up around the two bounded waits inside TimeoutStartSec.
_START_SLACK_SEC = 60


def render_service(profile: Profile, unit_name: str = SERVICE_UNIT) -> str:
    service = profile.service
    after = ["network-online.target"]
    if service.fabric_manager:
        after.append("nvidia-fabricmanager.service")
    python = _word(profile.python)
    wait_gpu_free = (
        f"{python} -m k26_ddtree wait-gpu-free --timeout {service.gpu_free_timeout_sec} "
        f"--max-used-mib {service.gpu_free_max_used_mib}"
    )
    wait_ready = (
        f"{python} -m k26_ddtree wait-ready --unit {_word(unit_name)} "
        f"--url {_word(local_url(profile))} --timeout {service.ready_timeout_sec}"
    )
    return _render(
        "k26-ddtree.service.j2",
        unit_name=unit_name,
        profile=profile,
        profile_summary=profile.summary(),
        open_port=open_port_comment(profile, "host", profile.host, profile.port),
        embedded_profile=PROFILE_MARK + to_json(profile),
        description=_escape_specifiers(f"{profile.description} [{profile.name}]"),
        after=after,
        service=service,
        env_file=_env_file_setting(profile),
        environment=[_assignment(k, v) for k, v in sorted(profile.environment.items())],
        wait_gpu_free=wait_gpu_free,
        exec_start=[f"{python} -m sglang.launch_server", *_flag_lines(server_flags(profile))],
        wait_ready=wait_ready,
        timeout_start_sec=service.gpu_free_timeout_sec + service.ready_timeout_sec + _START_SLACK_SEC,
    )


def render_router(profile: Profile, unit_name: str = ROUTER_UNIT) -> str:
    router = profile.router
    if not router.worker_urls:
        raise UserError(
            "router.worker_urls is empty: name the replicas, e.g. "
            "--set router.worker_urls=http://node1:30000,http://node2:30000"
        )
    return _render(
        "k26-ddtree-router.service.j2",
        unit_name=unit_name,
        profile=profile,
        router_package=ROUTER_PACKAGE,
        open_port=open_port_comment(profile, "router.host", router.host, router.port),
        embedded_profile=PROFILE_MARK + to_json(profile),
        service=profile.service,
        env_file=_env_file_setting(profile),
        exec_start=[f"{_word(profile.python)} -m sglang_router.launch_router", *_flag_lines(router_flags(profile))],
    )


def local_url(profile: Profile) -> str:
    """Where a client on this machine reaches the server (a wildcard bind is reached on loopback)."""
    host = profile.host
    if host == "0.0.0.0":
        host = "127.0.0.1"
    elif host == "::":
        host = "[::1]"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{profile.port}"


def profile_from_unit(text: str, origin: str) -> Profile:
    for line in text.splitlines():
        if line.startswith(PROFILE_MARK):
            return profile_from_json(line[len(PROFILE_MARK):], origin)
    raise UserError(f"{origin} was not rendered by k26-deploy (no embedded profile); install it with k26-deploy install")


def validate(text: str, unit_name: str) -> None:
    """A UserError quoting `systemd-analyze verify` if it has anything to say about the unit.

    It exits 0 on unknown keys and bad values, so any output at all counts as a problem.
    Without the tool the unit is not checked, and stderr says so.
    """
    tool = shutil.which("systemd-analyze")
    if tool is None:
        print(f"k26-deploy: warning: {unit_name}: {NOT_VALIDATED} (it comes with the systemd package)",
              file=sys.stderr, flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="k26-verify-") as tmp:
        path = Path(tmp) / f"{unit_name}.service"
        path.write_text(text, encoding="utf-8")
        try:
            proc = subprocess.run(
                [tool, "verify", "--man=no", str(path)],
                capture_output=True, text=True, timeout=60,
            )
        except subprocess.TimeoutExpired:
            raise UserError("systemd-analyze verify did not finish within 60 s") from None
    problem = (proc.stdout + proc.stderr).strip() or (
        f"systemd-analyze verify exited {proc.returncode}" if proc.returncode else "")
    if problem:
        raise UserError(f"systemd-analyze verify rejects the rendered unit: {' | '.join(problem.splitlines())}")


def _render(template: str, **context) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_path("services"))),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    return env.get_template(template).render(**context)


def _env_file_setting(profile: Profile) -> str:
    # Without an API key the file is optional ("-" prefix); with one, a missing file must fail the start.
    prefix = "" if profile.api_key else "-"
    return prefix + _escape_specifiers(profile.env_file)


def _flag_lines(flags: list[Flag]) -> list[str]:
    lines = []
    for name, value in flags:
        if value is None:
            lines.append(_word(name))
        elif isinstance(value, list):
            lines.append(" ".join(_word(v) for v in [name, *value]))
        elif value == API_KEY_REFERENCE:
            lines.append(f"{_word(name)} {value}")
        else:
            lines.append(f"{_word(name)} {_word(value)}")
    return lines


def _word(value: str) -> str:
    """One ExecStart= word: systemd specifiers and variables escaped, quoted when needed."""
    text = _escape_specifiers(value).replace("$", "$$")
    if text and not _NEEDS_QUOTES.intersection(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _assignment(name: str, value: str) -> str:
    text = _escape_specifiers(f"{name}={value}")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _escape_specifiers(text: str) -> str:
    return text.replace("%", "%%")
