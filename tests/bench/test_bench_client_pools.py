"""bench's HTTP client over real connections on 127.0.0.1: its pools keep connections alive between
requests, and no more than max_connections requests are ever in flight or connections open."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from k26_ddtree.bench.client import ServerClient

ANSWER = json.dumps({"text": "x", "meta_info": {"completion_tokens": 4, "prompt_tokens": 3,
                                                "spec_verify_ct": 1}}).encode()


class CountingServer(ThreadingHTTPServer):
    request_queue_size = 256
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), self._handler())
        self.lock = threading.Lock()
        self.connections = 0
        self.in_flight = self.most_in_flight = self.requests = 0

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                with server.lock:
                    server.connections += 1

            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                with server.lock:
                    server.in_flight += 1
                    server.requests += 1
                    server.most_in_flight = max(server.most_in_flight, server.in_flight)
                time.sleep(0.01)
                with server.lock:
                    server.in_flight -= 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(ANSWER)))
                self.end_headers()
                self.wfile.write(ANSWER)

        return Handler


def test_connections_stay_alive_and_within_the_bound_across_pools():
    server = CountingServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"

    async def drive() -> list:
        async with ServerClient(url, None, 30.0, max_connections=40) as client:
            # 48 callers against a bound of 40 (three pools of 16 at most): the client holds 8 back.
            async def caller():
                return [await client.generate_unstreamed({"input_ids": [1, 2, 3]}) for _ in range(10)]
            return [r for rs in await asyncio.gather(*(caller() for _ in range(48))) for r in rs]

    try:
        records = asyncio.run(drive())
    finally:
        server.shutdown()
        server.server_close()
    assert len(records) == 480 and all(r.ok and r.completion_tokens == 4 for r in records)
    assert server.requests == 480
    assert server.most_in_flight <= 40
    # Kept alive: the 480 requests went over at most the 40 connections the bound allows.
    assert server.connections <= 40
