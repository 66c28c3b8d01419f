"""A tiny served model on 127.0.0.1 for the bench's safety tests: real HTTP, a real model folder.

Like the pinned SGLang it takes any input_ids; unlike it, an id past the vocabulary (or a
special id) does not kill a GPU: it is recorded, and the server stops answering, as the real
one did (device-side assert, then SIGQUIT). `bodies` replaces the answer of a path with raw
bytes (status 200), for servers that answer nonsense; `trickle_s` makes a plain (not streamed)
/generate answer a byte every so many seconds, a minute's worth at most.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def write_model_folder(folder: Path, vocab_size: int, special_ids: tuple[int, ...] = (),
                       nested: bool = False) -> Path:
    """config.json (vocab_size at the top, or in text_config as Kimi K2.6 has it) and a
    tokenizer_config.json whose added tokens are `special_ids`."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": {"vocab_size": vocab_size}} \
        if nested else {"vocab_size": vocab_size}
    (folder / "config.json").write_text(json.dumps(config))
    added = {str(i): {"content": f"<|special_{i}|>", "special": True} for i in special_ids}
    (folder / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added}))
    return folder


class ModelServer:
    def __init__(self, vocab_size: int, model_path: str, special_ids: tuple[int, ...] = (),
                 bodies: dict[str, bytes] | None = None, trickle_s: float | None = None,
                 trickle_paths: frozenset[str] = frozenset(), huge: dict[str, int] | None = None):
        self.vocab_size = vocab_size
        self.special_ids = set(special_ids)
        self.model_path = model_path
        self.bodies = bodies or {}
        self.trickle_s = trickle_s
        self.trickle_paths = trickle_paths  # these answer a byte every trickle_s, streamed or not
        self.huge = huge or {}  # path: bytes of a JSON string answered there
        self.ids_seen: set[int] = set()
        self.generate_calls = 0
        self.dead = False
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> "ModelServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def out_of_vocabulary(self) -> list[int]:
        return sorted(i for i in self.ids_seen if not 0 <= i < self.vocab_size)

    @property
    def specials_sent(self) -> list[int]:
        return sorted(self.ids_seen & self.special_ids)

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _json(self, body) -> None:
                self._send(200, json.dumps(body).encode())

            def _trickle(self, content_type: str = "text/event-stream") -> None:
                bytes_ = int(60 / server.trickle_s)
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(bytes_))
                self.end_headers()
                try:
                    for _ in range(bytes_):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        time.sleep(server.trickle_s)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client gave up, as it should

            def _huge(self, size: int) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(size))
                self.end_headers()
                try:
                    self.wfile.write(b'"')
                    block = b"x" * (1 << 20)
                    for _ in range((size - 2) >> 20):
                        self.wfile.write(block)
                    self.wfile.write(b"x" * ((size - 2) % (1 << 20)) + b'"')
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client refused the rest, as it should

            def _answer(self, path: str, default) -> None:
                if path in server.trickle_paths:
                    self._trickle()
                elif path in server.huge:
                    self._huge(server.huge[path])
                elif path in server.bodies:
                    self._send(200, server.bodies[path])
                elif default is None:
                    self._send(404, b'{"detail": "Not Found"}')
                else:
                    self._json(default)

            def do_GET(self):
                if server.dead:
                    self.close_connection = True
                    return
                path = self.path.split("?")[0]
                info = {"model_path": server.model_path, "tokenizer_path": server.model_path}
                routes = {
                    "/health_generate": {},
                    "/server_info": {**info, "internal_states": [{}]},
                    "/model_info": {**info, "is_generation": True},
                    "/v1/models": {"data": [{"id": "tiny"}]},
                }
                self._answer(path, routes.get(path))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                path = self.path.split("?")[0]
                if server.dead:
                    self.close_connection = True
                    return
                if path == "/flush_cache":
                    self._json({})
                elif path == "/generate":
                    self._generate(body)
                elif path == "/v1/chat/completions":
                    self._answer(path, {"choices": [{"message": {"content": "no code"}}], "usage": {}})
                else:
                    self._send(404, b"{}")

            def _generate(self, body: dict) -> None:
                ids = body.get("input_ids") or []
                with server._lock:
                    server.generate_calls += 1
                    server.ids_seen.update(ids)
                if any(not 0 <= i < server.vocab_size for i in ids):
                    server.dead = True  # what the real server does: it is gone for everyone
                    self.close_connection = True
                    return
                if "/generate" in server.trickle_paths:
                    self._trickle()
                    return
                if "/generate" in server.huge:
                    self._huge(server.huge["/generate"])
                    return
                if server.trickle_s is not None and not body.get("stream"):
                    self._trickle("application/json")
                    return
                if "/generate" in server.bodies:
                    self._send(200, server.bodies["/generate"], "text/event-stream")
                    return
                n = int((body.get("sampling_params") or {}).get("max_new_tokens", 4))
                chunks = []
                for done in range(1, n + 1):
                    meta = {"prompt_tokens": len(ids), "completion_tokens": done, "spec_verify_ct": done}
                    chunks.append(f"data: {json.dumps({'text': ' tok' * done, 'meta_info': meta})}\n\n")
                self._send(200, ("".join(chunks) + "data: [DONE]\n\n").encode(), "text/event-stream")

        return Handler
