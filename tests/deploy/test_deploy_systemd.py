"""install -> start -> reconfigure -> failed reconfigure rolls back, against a real systemd.

The unit is the one users get, rendered from a profile that extends base; only
its python runs the stand-in sglang.launch_server (PYTHONPATH=tests/standin),
which loads for a second, then serves. The unit file and the last-good copy live
on the namespace's private /run, so nothing is left on the host. The last test
boots a namespace that carries trees under /tmp and /var/tmp, where CI may clone.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import sys
import tempfile
import urllib.request
import uuid
from pathlib import Path

import pytest

from as_nobody import AS_NOBODY, NobodyTree

from deploy_helpers import SCRATCH, STANDIN, free_port
from systemd_ns import HOLD_ROOT, SystemdNamespace, unavailable_reason

pytestmark = pytest.mark.systemd

UNIT = "k26-ddtree"
UNIT_DIR = "/run/systemd/system"
STATE = {"K26_STATE_DIR": "/run/k26-ddtree-state"}
API_KEY = "sk-test-0123456789"
FAIL_AT_START_BUDGET = 3
NEVER_HEALTHY_BUDGET = 5
NOTE = '50% "quoted" $HOME \\ kept'


def _get(url: str, path: str, key: str | None = API_KEY) -> tuple[int, dict]:
    request = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {key}"} if key else {})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, {}


def _write_profile(scratch, port: int):
    env_file = scratch / "k26-ddtree.env"
    env_file.write_text(f"K26_API_KEY={API_KEY}\n")
    env_file.chmod(0o600)
    profile = scratch / "standin.yaml"
    profile.write_text(
        f"""\
extends: pcie-ep8
description: stand-in server under a real systemd
python: {sys.executable}
model: {scratch}/model
drafter: {scratch}/drafter
port: {port}
api_key: true
env_file: {env_file}
environment:
  PYTHONPATH: "{STANDIN}"
  STANDIN_LOAD_SECONDS: "1"
  STANDIN_WARMUP_SECONDS: "0.5"
  STANDIN_FAIL: start
  STANDIN_FAIL_BUDGET: "{FAIL_AT_START_BUDGET}"
  NOTE: '{NOTE.replace("'", "''")}'
service:
  gpu_free_timeout_sec: 10
  ready_timeout_sec: 30
  timeout_stop_sec: 15
  restart_sec: 1
"""
    )
    return profile


def test_install_start_reconfigure_and_rollback(systemd_ns, scratch):
    ns = systemd_ns
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    profile = _write_profile(scratch, port)

    def k26(*args: str, timeout: float = 120):
        return ns.run([sys.executable, "-m", "k26_ddtree", *args], timeout=timeout, env=STATE)

    def explain(proc) -> str:
        return f"rc {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}\njournal:\n{ns.journal(UNIT)}"

    def main_pid() -> int:
        return int(ns.systemctl_show(UNIT, "MainPID")["MainPID"])

    installed = k26("install", "--profile", str(profile), "--unit-dir", UNIT_DIR, "--allow-missing-model")
    assert installed.returncode == 0, explain(installed)
    assert ns.systemctl_show(UNIT, "FragmentPath")["FragmentPath"] == f"{UNIT_DIR}/{UNIT}.service"

    # systemctl start returns only once the server is ready: no wait of ours in between.
    started = ns.run(["systemctl", "start", UNIT], timeout=90)
    assert started.returncode == 0, explain(started)
    first_pid = main_pid()
    assert _get(url, "/health_generate", key=None)[0] == 200
    code, info = _get(url, "/server_info")
    assert code == 200 and info["pid"] == first_pid
    assert info["speculative_ddtree_budget"] == 8 and info["speculative_ddtree_topk"] == 4
    assert info["api_key"] == API_KEY, "systemd expands ${K26_API_KEY} from the EnvironmentFile"
    environ = ns.run(["cat", f"/proc/{first_pid}/environ"]).stdout.split("\0")
    assert f"NOTE={NOTE}" in environ, "specifiers, quotes, $ and backslashes reach the process intact"
    journal = ns.journal(UNIT)
    assert f"pid {first_pid}" in journal and "ready:" in journal, journal

    dry = k26("reconfigure", "--budget", "12", "--dry-run", "--allow-missing-model")
    assert dry.returncode == 0, explain(dry)
    assert "+    --speculative-ddtree-budget 12" in dry.stdout and "-    --speculative-ddtree-budget 8" in dry.stdout
    assert main_pid() == first_pid, "--dry-run must not restart anything"

    retuned = k26("reconfigure", "--budget", "16", "--allow-missing-model")
    assert retuned.returncode == 0, explain(retuned)
    assert "k26-ddtree reconfigured: standin (budget 16, topk 4" in retuned.stdout, explain(retuned)
    second_pid = main_pid()
    assert second_pid not in (0, first_pid)
    code, info = _get(url, "/server_info")
    assert code == 200 and info["pid"] == second_pid
    argv = info["argv"]
    assert argv[argv.index("--speculative-ddtree-budget") + 1] == "16"
    assert argv[argv.index("--speculative-ddtree-topk") + 1] == "4"

    broken = k26("reconfigure", "--budget", str(FAIL_AT_START_BUDGET), "--allow-missing-model")
    assert broken.returncode == 1, explain(broken)
    assert "rolled back" in broken.stderr and "ready again" in broken.stderr, explain(broken)
    assert "Traceback" not in broken.stderr
    third_pid = main_pid()
    assert third_pid not in (0, second_pid)
    code, info = _get(url, "/server_info")
    assert code == 200 and info["pid"] == third_pid and info["speculative_ddtree_budget"] == 16
    unit_text = ns.run(["cat", f"{UNIT_DIR}/{UNIT}.service"]).stdout
    assert "--speculative-ddtree-budget 16" in unit_text, "the last-good unit is back in place"

    # A server that binds but never turns healthy: the unit's own readiness gate times out.
    hung = k26(
        "reconfigure", "--budget", str(NEVER_HEALTHY_BUDGET), "--allow-missing-model",
        "--set", "environment.STANDIN_FAIL=health",
        "--set", f"environment.STANDIN_FAIL_BUDGET={NEVER_HEALTHY_BUDGET}",
        "--set", "service.ready_timeout_sec=4",
    )
    assert hung.returncode == 1, explain(hung)
    assert "rolled back" in hung.stderr and "ready again" in hung.stderr, explain(hung)
    code, info = _get(url, "/server_info")
    assert code == 200 and info["speculative_ddtree_budget"] == 16 and info["pid"] == main_pid()

    # tune's schedule file: its schedule and its spine replace budget/topk; --budget brings them back.
    # The documented tune flow measures DFLASH last, so the file replaces a DFLASH unit.
    dflash = k26("reconfigure", "--set", "speculative.algorithm=DFLASH", "--allow-missing-model")
    assert dflash.returncode == 0, explain(dflash)
    assert "--speculative-ddtree-budget" not in _get(url, "/server_info")[1]["argv"]
    tuned = scratch / "tuned.json"
    tuned.write_text(json.dumps({"schema": "k26-ddtree-tune/1", "schedule": "1:16/4,8:8/4,32:0", "spine": False,
                                 "buckets": []}))
    scheduled = k26("reconfigure", "--schedule-file", str(tuned), "--allow-missing-model")
    assert scheduled.returncode == 0, explain(scheduled)
    assert "(schedule 1:16/4,8:8/4,32:0, block 8, spine off, SGLang 0.5.11)" in scheduled.stdout, explain(scheduled)
    code, info = _get(url, "/server_info")
    assert code == 200 and info["pid"] == main_pid()
    argv = info["argv"]
    assert argv[argv.index("--speculative-ddtree-budget-schedule") + 1] == "1:16/4,8:8/4,32:0"
    assert argv[argv.index("--speculative-algorithm") + 1] == "DDTREE"
    assert "--speculative-ddtree-budget" not in argv and "--speculative-ddtree-spine" not in argv
    restored = k26("reconfigure", "--budget", "16", "--set", "speculative.spine=true", "--allow-missing-model")
    assert restored.returncode == 0, explain(restored)
    argv = _get(url, "/server_info")[1]["argv"]
    assert "--speculative-ddtree-budget-schedule" not in argv and "--speculative-ddtree-spine" in argv

    status = k26("status")
    assert status.returncode == 0, explain(status)
    assert "budget 16, topk 4" in status.stdout and f"{main_pid()}" in status.stdout
    assert "ready:" in status.stdout
    as_json = json.loads(k26("status", "--json").stdout)
    assert as_json["ready"] is True and as_json["live_budget_topk"] == [16, 4]


def test_status_and_reconfigure_say_when_nothing_is_installed(systemd_ns):
    for args in (["status", "--unit", "k26-absent"], ["reconfigure", "--unit", "k26-absent", "--budget", "4"]):
        proc = systemd_ns.run([sys.executable, "-m", "k26_ddtree", *args], env=STATE)
        assert proc.returncode == 2
        assert proc.stderr.strip() == "k26-deploy: error: k26-absent is not installed; install it first: " \
            "k26-deploy install --profile PROFILE"



def test_install_start_waits_and_records_last_good(systemd_ns, scratch):
    port = free_port()
    profile = _write_profile(scratch, port)
    state = scratch / "state"
    proc = systemd_ns.run(
        [sys.executable, "-m", "k26_ddtree", "install", "--profile", str(profile), "--unit", "k26-second",
         "--unit-dir", UNIT_DIR, "--allow-missing-model", "--start", "--state-dir", str(state)],
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr + systemd_ns.journal("k26-second")
    pid = int(systemd_ns.systemctl_show("k26-second", "MainPID")["MainPID"])
    assert f"k26-second ready: pid {pid}" in proc.stdout
    assert _get(f"http://127.0.0.1:{port}", "/server_info")[1]["pid"] == pid
    assert "--speculative-ddtree-budget 8" in (state / "k26-second.service.last-good").read_text()
    systemd_ns.run(["systemctl", "stop", "k26-second"], timeout=60)


def test_a_second_restart_of_the_same_unit_is_refused(systemd_ns, scratch):
    profile = _write_profile(scratch, free_port())
    state = scratch / "state"

    def k26(*args: str):
        return systemd_ns.run([sys.executable, "-m", "k26_ddtree", *args, "--unit", "k26-locked",
                               "--state-dir", str(state)], timeout=60)

    assert k26("install", "--profile", str(profile), "--unit-dir", UNIT_DIR, "--allow-missing-model").returncode == 0
    state.mkdir(exist_ok=True)
    with open(state / ".k26-locked.service.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = k26("reconfigure", "--budget", "4", "--allow-missing-model")
    assert proc.returncode == 2
    assert "another k26-deploy is restarting k26-locked right now" in proc.stderr


def test_a_failed_daemon_reload_puts_the_previous_unit_back(systemd_ns):
    """nobody may write this unit dir but not reload systemd: the install fails and leaves no trace."""
    # Outside the checkout (which may sit in a root-only folder) and outside the namespace's
    # private /tmp, so that nobody reaches the toolkit and the unit dir inside the namespace.
    nobody = NobodyTree(["k26_ddtree.deploy.cli", "k26_ddtree.deploy.service", "k26_ddtree.deploy.units",
                         "k26_ddtree.deploy.profiles"], parent=Path("/var/lib/k26-test-nobody"))
    try:
        units = nobody.scratch("units")
        # The unit is never started: its python only has to be one nobody may run, for systemd-analyze verify.
        unit_python = shutil.which("python3", path="/usr/bin:/bin")
        if unit_python is None:
            pytest.skip("needs a system python3 that nobody may run")
        install = ["-m", "k26_ddtree", "install", "--profile", "pcie-ep8", "--allow-missing-model",
                   "--unit-dir", str(units), "--set", f"python={unit_python}"]

        first = systemd_ns.run([sys.executable, *install, "--unit", "k26-reload"])
        assert first.returncode == 0, first.stdout + first.stderr
        before = (units / "k26-reload.service").read_text()

        as_nobody = [*AS_NOBODY, nobody.python]
        changed = systemd_ns.run([*as_nobody, *install, "--unit", "k26-reload", "--set", "speculative.budget=16"],
                                 env=nobody.env)
        assert changed.returncode == 2 and "Traceback" not in changed.stderr, changed.stdout + changed.stderr
        assert changed.stderr.strip().startswith("k26-deploy: error: systemctl daemon-reload failed: ")
        assert changed.stderr.strip().endswith(f"put the previous {units}/k26-reload.service back")
        assert (units / "k26-reload.service").read_text() == before

        fresh = systemd_ns.run([*as_nobody, *install, "--unit", "k26-fresh"], env=nobody.env)
        assert fresh.returncode == 2 and fresh.stderr.strip().endswith(f"removed {units}/k26-fresh.service again")
        assert sorted(p.name for p in units.iterdir()) == ["k26-reload.service"], "no new unit, no temp file"
    finally:
        nobody.remove()


def test_checkouts_under_tmp_and_var_tmp_stay_visible_and_the_hosts_tmp_is_kept():
    """CI clones wherever it likes: a tree under /tmp or /var/tmp is seen at its own path inside."""
    carried = [Path(tempfile.mkdtemp(prefix="k26-carry-", dir=root)) for root in ("/tmp", "/var/tmp")]
    host_only = Path(tempfile.mkdtemp(prefix="k26-host-only-", dir="/tmp"))
    workdir = SCRATCH / f"ns-{uuid.uuid4().hex[:12]}"
    ns = None
    try:
        reason = unavailable_reason(carried)
        if reason:
            pytest.skip(f"real-systemd test: {reason}")
        for tree in carried:
            (tree / "nested").mkdir()
            (tree / "nested" / "kept.txt").write_text(str(tree))
        (host_only / "kept.txt").write_text("host")
        workdir.mkdir(parents=True)
        holds_before = set(HOLD_ROOT.glob("*"))
        ns = SystemdNamespace(workdir, carried)
        ns.start()
        for tree in carried:
            assert ns.run(["cat", str(tree / "nested" / "kept.txt")]).stdout == str(tree)
            assert ns.run(["touch", str(tree / "written-inside")]).returncode == 0
        assert ns.run(["test", "-e", str(host_only)]).returncode == 1, "the namespace has its own /tmp"
        assert (host_only / "kept.txt").read_text() == "host", "systemd's boot clean-up left the host's /tmp alone"
        ns.stop()
        for tree in carried:
            assert (tree / "nested" / "kept.txt").read_text() == str(tree)
            assert (tree / "written-inside").exists(), "the carried tree is the host's, not a copy"
        assert set(HOLD_ROOT.glob("*")) <= holds_before, "its holding dirs are removed"
    finally:
        if ns is not None:
            ns.stop()
        for tree in (*carried, host_only, workdir):
            shutil.rmtree(tree, ignore_errors=True)
