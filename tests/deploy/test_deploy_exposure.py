"""Listening beyond loopback takes an API key, or an opt-out the unit names (issue 15, item 4)."""

from __future__ import annotations

import shutil

import pytest

from deploy_helpers import directives, exec_start_words, k26, one_line_error

from k26_ddtree.deploy.exposure import is_loopback

WORKERS = "router.worker_urls=http://10.0.0.1:30000,http://10.0.0.2:30000"
needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                   reason="systemd-analyze not installed (the systemd package)")


def render(*sets: str, router: bool = False):
    args = ["render", "--profile", "pcie-ep8", "--allow-missing-model", *(["--router"] if router else [])]
    for assignment in sets:
        args += ["--set", assignment]
    return k26(*args)


def test_loopback_is_the_only_bind_that_needs_no_key():
    assert all(map(is_loopback, ["127.0.0.1", "127.0.0.2", "::1", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.5", "node1", "fe80::1"]))


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "node1.example"])
def test_a_worker_beyond_loopback_without_a_key_is_refused(host):
    message = one_line_error(render(f"host={host}"))
    assert f"host {host} listens beyond loopback with no API key" in message
    assert "api_key: true" in message and "open_without_api_key: true" in message


def test_the_router_opened_without_a_key_is_refused():
    message = one_line_error(render(WORKERS, "router.host=0.0.0.0", router=True))
    assert "router.host 0.0.0.0 listens beyond loopback with no API key" in message


@needs_analyze
def test_with_a_key_worker_and_router_take_it_from_the_env_file():
    worker = render("host=0.0.0.0", "api_key=true")
    assert worker.returncode == 0 and worker.stderr == "", worker.stderr
    words = exec_start_words(worker.stdout)
    assert words[words.index("--host") + 1] == "0.0.0.0"
    assert words[words.index("--api-key") + 1] == "${K26_API_KEY}"
    assert "# OPEN" not in worker.stdout

    router = render(WORKERS, "router.host=0.0.0.0", "api_key=true", router=True)
    assert router.returncode == 0 and router.stderr == "", router.stderr
    words = exec_start_words(router.stdout)
    assert words[words.index("--api-key") + 1] == "${K26_API_KEY}"
    assert directives(router.stdout, "EnvironmentFile") == ["/etc/k26-ddtree/k26-ddtree.env"], "required with a key"
    assert "# OPEN" not in router.stdout


@needs_analyze
def test_the_opt_out_is_named_in_the_unit():
    worker = render("host=0.0.0.0", "open_without_api_key=true")
    assert worker.returncode == 0 and worker.stderr == "", worker.stderr
    assert ("# OPEN: listens on 0.0.0.0 port 30000 with no API key (open_without_api_key: true): "
            "anyone who reaches this port can use the model.") in worker.stdout.splitlines()
    assert "--api-key" not in exec_start_words(worker.stdout)

    router = render(WORKERS, "router.host=0.0.0.0", "open_without_api_key=true", router=True)
    assert router.returncode == 0 and router.stderr == "", router.stderr
    assert "# OPEN: listens on 0.0.0.0 port 30080 with no API key" in router.stdout
    assert "--api-key" not in exec_start_words(router.stdout)


def test_loopback_binds_render_without_key_or_comment():
    for host in ("127.0.0.1", "::1", "localhost"):
        proc = render(f"host={host}")
        assert proc.returncode == 0, proc.stderr
        assert "# OPEN" not in proc.stdout and "--api-key" not in proc.stdout
    router = render(WORKERS, router=True)
    assert router.returncode == 0 and "# OPEN" not in router.stdout, router.stderr
    assert "--host 127.0.0.1" in router.stdout, "the router binds loopback unless opened"
