"""A stand-in Hugging Face hub on 127.0.0.1 for the fetch tests (stdlib only).

It answers the two shapes fetch-model uses:
- `GET /api/models/{owner}/{name}/revision/{rev}?blobs=true` -> {"id", "sha", "siblings": [
  {"rfilename", "size", "blobId", "lfs": {"sha256", "size", "pointerSize"}}]} (lfs only for LFS files)
- `GET /{owner}/{name}/resolve/{rev}/{path}`: small files directly; LFS files by a 302 to
  `/cdn/{sha256}`, as the real hub redirects to its CDN. Both honour `Range: bytes=a-[b]` with
  206 + Content-Range, which is what aria2c's resume and split downloads send.

The API and resolve routes demand `Authorization: Bearer <token>`. Tests steer it through
attributes: `chunk_delay_s` (throttle), `corrupt[path] = n` (serve wrong bytes for the next n
full responses, -1 forever), `raw_listings[repo] = body` (answer the API route for `repo` with
these bytes verbatim, for hostile listings), and read back `requests`, `bytes_sent` and
`max_active`.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

_CHUNK = 64 * 1024


def deterministic_bytes(seed: str, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeFile:
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class Seen:
    method: str
    path: str
    range: str | None
    authorized: bool


class FakeHub:
    def __init__(self, token: str):
        self.token = token
        self.repos: dict[str, tuple[str, dict[str, FakeFile]]] = {}
        self.chunk_delay_s = 0.0
        self.corrupt: dict[str, int] = {}
        self.raw_listings: dict[str, bytes] = {}
        self.requests: list[Seen] = []
        self.bytes_sent: dict[str, int] = {}
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add_repo(self, repo: str, files: dict[str, FakeFile]) -> str:
        commit = hashlib.sha1(repo.encode() + b"".join(
            name.encode() + bytes.fromhex(f.sha256) for name, f in sorted(files.items()))).hexdigest()
        self.repos[repo] = (commit, files)
        return commit

    def range_starts(self, path_suffix: str, since: int = 0) -> list[int]:
        """Start offsets of the Range requests (from request number `since` on) for downloads
        whose URL ends with `path_suffix`."""
        starts = []
        for seen in self.requests[since:]:
            if seen.path.endswith(path_suffix) and seen.range:
                starts.append(int(re.match(r"bytes=(\d+)-", seen.range).group(1)))
        return starts

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as aria2c expects of a real server
    fake: FakeHub

    def log_message(self, format, *args) -> None:
        pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def _route(self, head: bool) -> None:
        fake = self.fake
        url = urlsplit(self.path)
        path = unquote(url.path)
        authorized = self.headers.get("Authorization") == f"Bearer {fake.token}"
        with fake._lock:
            fake.requests.append(Seen(self.command, path, self.headers.get("Range"), authorized))
        api = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        cdn = re.fullmatch(r"/cdn/([0-9a-f]{64})", path)
        if (api or resolve) and not authorized:
            return self._send_json(401, {"error": "Invalid credentials in Authorization header"})
        if api:
            return self._api(api.group(1), api.group(2))
        if resolve:
            return self._resolve(resolve.group(1), resolve.group(2), resolve.group(3), head)
        if cdn:
            for _commit, files in fake.repos.values():
                for name, file in files.items():
                    if file.lfs and file.sha256 == cdn.group(1):
                        return self._serve(name, file, head)
        return self._send_json(404, {"error": "Entry not found"})

    def _api(self, repo: str, revision: str) -> None:
        if repo in self.fake.raw_listings:
            return self._send_raw(200, self.fake.raw_listings[repo])
        if repo not in self.fake.repos:
            return self._send_json(404, {"error": "Repository not found"})
        commit, files = self.fake.repos[repo]
        if revision not in ("main", commit):
            return self._send_json(404, {"error": f"Invalid rev id: {revision}"})
        siblings = []
        for name, file in files.items():
            sibling = {"rfilename": name, "size": len(file.data), "blobId": git_blob_id(file.data)}
            if file.lfs:
                # An LFS file's git blob is its pointer; the hub's blobId is that pointer's id.
                sibling["blobId"] = git_blob_id(f"oid sha256:{file.sha256}".encode())
                sibling["lfs"] = {"sha256": file.sha256, "size": len(file.data), "pointerSize": 134}
            siblings.append(sibling)
        self._send_json(200, {"_id": "0" * 24, "id": repo, "modelId": repo, "sha": commit,
                              "private": False, "siblings": siblings})

    def _resolve(self, repo: str, revision: str, name: str, head: bool) -> None:
        entry = self.fake.repos.get(repo)
        if entry is None or revision not in ("main", entry[0]) or name not in entry[1]:
            return self._send_json(404, {"error": "Entry not found"})
        file = entry[1][name]
        if file.lfs:
            self.send_response(302)
            self.send_header("Location", f"/cdn/{file.sha256}")
            self.send_header("X-Linked-Etag", f'"{file.sha256}"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._serve(name, file, head)

    def _serve(self, name: str, file: FakeFile, head: bool) -> None:
        fake = self.fake
        data = file.data
        with fake._lock:
            left = fake.corrupt.get(name, 0)
            if left and not head:
                data = bytes(b ^ 0x5A for b in data[:4096]) + data[4096:]
                fake.corrupt[name] = left - 1 if left > 0 else left
        total = len(data)
        start, end = 0, total - 1
        wanted = self.headers.get("Range")
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", wanted or "")
        if match:
            start = int(match.group(1))
            end = min(int(match.group(2)), total - 1) if match.group(2) else total - 1
            if start >= total:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{total}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{total}")
        else:
            self.send_response(200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("ETag", f'"{file.sha256 if file.lfs else git_blob_id(file.data)}"')
        self.end_headers()
        if head:
            return
        with fake._lock:
            fake.active += 1
            fake.max_active = max(fake.max_active, fake.active)
        try:
            offset = start
            while offset <= end:
                piece = data[offset:min(offset + _CHUNK, end + 1)]
                self.wfile.write(piece)
                offset += len(piece)
                with fake._lock:
                    fake.bytes_sent[name] = fake.bytes_sent.get(name, 0) + len(piece)
                if fake.chunk_delay_s:
                    time.sleep(fake.chunk_delay_s)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            with fake._lock:
                fake.active -= 1

    def _send_json(self, status: int, body: dict) -> None:
        self._send_raw(status, json.dumps(body).encode())

    def _send_raw(self, status: int, raw: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(raw)
