"""The router unit, as `render --router` writes it, run by a real systemd with the pinned sglang-router.

Its API key comes from the EnvironmentFile: a client without it is refused, a
client with it is served, and the router sends the key on to the worker (here
a small HTTP server in this test that records what it is sent).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from deploy_helpers import free_port
from sglang_source import unpacked_wheel

from k26_ddtree.deploy.flags import ROUTER_PACKAGE

pytestmark = [pytest.mark.systemd, pytest.mark.network]

API_KEY = "sk-router-0123456789"
UNIT = "k26-router-test"


class _Worker(BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None]] = []

    def _answer(self) -> None:
        _Worker.seen.append((self.path, self.headers.get("Authorization")))
        body = json.dumps({"text": "Paris", "meta_info": {"completion_tokens": 1}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = _answer

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def worker():
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Worker)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Worker.seen.clear()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _generate(url: str, key: str | None) -> int:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url + "/generate", data=b'{"text": "The capital of France is"}',
                                     headers=headers, method="POST")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def test_the_router_unit_demands_the_key_and_passes_it_on(systemd_ns, scratch, worker):
    ns = systemd_ns
    site = unpacked_wheel(ROUTER_PACKAGE)
    python = scratch / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    env_file = scratch / "k26-ddtree.env"
    env_file.write_text(f"K26_API_KEY={API_KEY}\n")
    env_file.chmod(0o600)
    port = free_port()
    profile = scratch / "router.yaml"
    profile.write_text(f"extends: pcie-ep8\npython: {python}\napi_key: true\nenv_file: {env_file}\n"
                       f"router:\n  port: {port}\n  worker_urls: [{worker}]\n")

    rendered = ns.run([sys.executable, "-m", "k26_ddtree", "render", "--router", "--profile", str(profile),
                       "--unit", UNIT])
    assert rendered.returncode == 0 and rendered.stderr == "", rendered.stderr
    unit_file = scratch / f"{UNIT}.service"
    unit_file.write_text(rendered.stdout)
    assert ns.run(["cp", str(unit_file), f"/run/systemd/system/{UNIT}.service"]).returncode == 0
    assert ns.run(["systemctl", "daemon-reload"]).returncode == 0
    try:
        started = ns.run(["systemctl", "start", UNIT], timeout=60)
        assert started.returncode == 0, started.stderr + ns.journal(UNIT)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while _generate(url, None) == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _generate(url, None) == 401, ns.journal(UNIT)
        assert _generate(url, "not-the-key") == 401
        assert _generate(url, API_KEY) == 200, ns.journal(UNIT)
        assert ("/generate", f"Bearer {API_KEY}") in _Worker.seen, "the router sends the key on to the worker"
        assert all(path != "/generate" or auth == f"Bearer {API_KEY}" for path, auth in _Worker.seen)
    finally:
        ns.run(["systemctl", "stop", UNIT], timeout=60)
