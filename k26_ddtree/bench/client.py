"""Async HTTP client for the SGLang endpoints the benchmark drives.

One `ServerClient` per run; every request returns a record instead of raising,
so a failed request is counted and reported, never dropped.

Requests go through httpx pools of at most POOL_CONNECTIONS connections each, first fit. One
pool of C connections does work on every request that grows with C: on the proving ground's
tiny target it capped a closed loop of 64 at about 100 requests/s, half of what the server
served to 64 threads (bench/results/2026-12-01-tiny-tune-both-drafters; bench/bench_client.py measures it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx

from k26_ddtree import jsonread
from k26_ddtree.errors import UserError

API_KEY_ENV = "K26_API_KEY"
WAIT_NOTE_EVERY_S = 10.0
# SGLang's answers nest under 10 levels; deeper is refused before the secret scrubber and the
# results writer, which recurse once per level, meet it.
MAX_ANSWER_DEPTH = 64
# Far more than any answer SGLang gives (a long completion's text is a few hundred KB): a larger
# one is refused before it fills memory, a cost that multiplies with the requests in flight.
MAX_ANSWER_BYTES = 16 << 20
# Small enough that a pool's per-request work stays flat, large enough that a closed loop of 16
# takes one pool (a pool per request ran about 8 % fewer requests/s at C=16 in bench_client.py).
POOL_CONNECTIONS = 16


class EndpointMissing(UserError):
    """The server answered 404: it has no such endpoint."""


def read_api_key(path: Path | None) -> str | None:
    """The API key from --api-key-file, else $K26_API_KEY, else None (never printed)."""
    if path is not None:
        try:
            key = path.read_text(encoding="utf-8").strip()
        except OSError as err:
            raise UserError(f"cannot read --api-key-file {path}: {err.strerror}") from None
        except UnicodeDecodeError:
            raise UserError(f"--api-key-file {path} is not text (not UTF-8)") from None
        if not key:
            raise UserError(f"--api-key-file {path} is empty")
        return key
    return os.environ.get(API_KEY_ENV) or None


@dataclass
class GenerateRecord:
    """What one /generate request did, timed on the client."""

    ok: bool
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    spec_verify_ct: int = 0
    latency_s: float = 0.0
    ttft_s: float | None = None
    chunk_gaps_s: list[float] = field(default_factory=list)
    text: str = ""
    aborted: bool = False  # the server ended it early (finish_reason "abort"): its tokens are a prefix


@dataclass
class ChatRecord:
    """What one /v1/chat/completions request returned."""

    ok: bool
    error: str | None = None
    message: dict = field(default_factory=dict)
    completion_tokens: int = 0
    latency_s: float = 0.0


def _exception_text(err: Exception) -> str:
    """httpx transport errors often have an empty message; name what lies under them."""
    detail = str(err) or repr(err.__cause__ or err.__context__ or "")
    return f"{type(err).__name__}: {detail}"[:200]


def _count(meta: dict, key: str) -> int:
    """A meta_info count; ValueError for a negative one: its rates would break the results
    file's bounds, and every later save of the run re-reads that file."""
    value = int(meta.get(key) or 0)
    if value < 0:
        raise ValueError(f"meta_info {key} is {value}")
    return value


class AnswerTooLarge(ValueError):
    """An answer body, or one line of a stream, over MAX_ANSWER_BYTES."""


async def _body(response: httpx.Response) -> bytes:
    """The whole body of a streamed response, refused past MAX_ANSWER_BYTES."""
    data = bytearray()
    async for piece in response.aiter_bytes():
        data += piece
        if len(data) > MAX_ANSWER_BYTES:
            raise AnswerTooLarge(f"the answer is larger than {MAX_ANSWER_BYTES >> 20} MB")
    return bytes(data)


async def _lines(response: httpx.Response):
    """The lines of a streamed body, each refused past MAX_ANSWER_BYTES."""
    pending = bytearray()
    async for piece in response.aiter_bytes():
        pending += piece
        *whole, rest = pending.split(b"\n")
        for line in whole:
            yield line.rstrip(b"\r").decode("utf-8", errors="replace")
        pending = bytearray(rest)
        if len(pending) > MAX_ANSWER_BYTES:
            raise AnswerTooLarge(f"a stream line is longer than {MAX_ANSWER_BYTES >> 20} MB")
    if pending:
        yield pending.decode("utf-8", errors="replace")


def _error_text(response: httpx.Response, body: bytes) -> str:
    snippet = body.decode(errors="replace").strip().replace("\n", " ")
    return f"HTTP {response.status_code}: {snippet[:200]}"


class ServerClient:
    """Bounded async client for one SGLang server."""

    def __init__(self, base_url: str, api_key: str | None, timeout_s: float, max_connections: int):
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._in_flight = asyncio.Semaphore(max_connections)
        # Built once: a client builds its own otherwise, 15 ms of CA loading each, on the event loop.
        self._tls = httpx.create_ssl_context()
        self._pools: list[httpx.AsyncClient] = []
        self._load: list[int] = []  # requests in flight per pool

    async def __aenter__(self) -> "ServerClient":
        return self

    async def __aexit__(self, *exc) -> None:
        # Every pool closed, even where one fails to.
        await asyncio.gather(*(http.aclose() for http in self._pools), return_exceptions=True)

    @contextlib.asynccontextmanager
    async def _pool(self):
        """The pool for one request: the first with a connection free, or a new one. First fit, so
        that a later pool is used only while the earlier ones are full: the connections opened
        never exceed max_connections, and they stay alive."""
        async with self._in_flight:
            i = next((i for i, load in enumerate(self._load) if load < POOL_CONNECTIONS), None)
            if i is None:
                self._pools.append(httpx.AsyncClient(
                    base_url=self.base_url, headers=self._headers, verify=self._tls,
                    timeout=httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 30.0)),
                    limits=httpx.Limits(max_connections=POOL_CONNECTIONS, max_keepalive_connections=POOL_CONNECTIONS)))
                self._load.append(0)
                i = len(self._pools) - 1
            self._load[i] += 1
            try:
                yield self._pools[i]
            finally:
                self._load[i] -= 1

    async def _get_json(self, path: str) -> dict:
        """The JSON object at `path`; anything else (no answer, an error status, a body that is
        not a JSON object or nests too deep to record) is one UserError line."""
        url = f"{self.base_url}{path}"
        try:
            response, content = await asyncio.wait_for(self._request("GET", path), self.timeout_s)
        except asyncio.TimeoutError:
            raise UserError(f"{url} gave no whole answer within --request-timeout {self.timeout_s:g}s") from None
        except AnswerTooLarge as err:
            raise UserError(f"{url}: {err}") from None
        except httpx.HTTPError as err:
            raise UserError(f"cannot reach {url}: {_exception_text(err)}") from None
        if response.status_code == 401:
            raise UserError(f"{url} answered 401: give the API key (--api-key-file or ${API_KEY_ENV})")
        if response.status_code == 404:
            raise EndpointMissing(f"{url} answered HTTP 404")
        if response.status_code != 200:
            raise UserError(f"{url} answered HTTP {response.status_code}")
        try:
            body = jsonread.parse_json(content, f"the answer of {url}", MAX_ANSWER_DEPTH)
        except jsonread.TooDeep as err:
            raise UserError(f"{url} answered {err}") from None
        except jsonread.Unreadable:
            raise UserError(f"{url} did not answer JSON") from None
        if not isinstance(body, dict):
            raise UserError(f"{url} answered {json.dumps(body)[:40]}, not a JSON object")
        return body

    async def _request(self, method: str, path: str, **kwargs) -> tuple[httpx.Response, bytes]:
        """(response, body) of one request, the body read under MAX_ANSWER_BYTES; the caller bounds
        the time (httpx's timeout bounds each read, and a body trickled a byte at a time never trips it)."""
        async with self._pool() as http, http.stream(method, path, **kwargs) as response:
            return response, await _body(response)

    async def server_info(self) -> dict:
        """GET /server_info (the older alias /get_server_info when the first is missing)."""
        try:
            return await self._get_json("/server_info")
        except EndpointMissing:
            return await self._get_json("/get_server_info")

    async def model_info(self) -> dict:
        """GET /model_info; {} when the server does not have it."""
        try:
            return await self._get_json("/model_info")
        except EndpointMissing:
            return {}

    async def model_name(self) -> str:
        data = (await self._get_json("/v1/models")).get("data")
        first = data[0] if isinstance(data, list) and data else None
        if not isinstance(first, dict) or not isinstance(first.get("id"), str):
            raise UserError(f"{self.base_url}/v1/models lists no model")
        return first["id"]

    async def wait_healthy(self, timeout_s: float, note: Callable[[str], None]) -> None:
        """Poll /health_generate until 200, bounded by timeout_s; `note` hears what is awaited,
        at the first miss and every WAIT_NOTE_EVERY_S after."""
        url = f"{self.base_url}/health_generate"
        started = time.monotonic()
        deadline = started + timeout_s
        last, noted_at = "no answer", None
        while time.monotonic() < deadline:
            try:
                # The whole answer within what is left: a server trickling bytes must not hold the wait.
                left = min(20.0, deadline - time.monotonic())
                response, _ = await asyncio.wait_for(self._request("GET", "/health_generate"), max(left, 0.001))
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}"
            except asyncio.TimeoutError:
                last = "no whole answer in time"
            except (httpx.HTTPError, AnswerTooLarge) as err:
                last = _exception_text(err)
            now = time.monotonic()
            if noted_at is None or now - noted_at >= WAIT_NOTE_EVERY_S:
                noted_at = now
                note(f"bench: waiting for {url} to answer 200 ({now - started:.0f}s of {timeout_s:g}s; "
                     f"now: {last})")
            await asyncio.sleep(1.0)
        raise UserError(f"{self.base_url} not healthy after {timeout_s:g}s: {url} never answered 200 (last: {last})")

    async def flush_cache(self, attempts: int = 10) -> None:
        """POST /flush_cache so the server's averages cover one cell.

        SGLang refuses (HTTP 400) while requests are still running, e.g. an
        aborted warm-up; retry a bounded number of times.
        """
        last = ""
        for _ in range(attempts):
            try:
                response, _ = await asyncio.wait_for(self._request("POST", "/flush_cache"), self.timeout_s)
            except asyncio.TimeoutError:
                last = "no whole answer in time"
            except (httpx.HTTPError, AnswerTooLarge) as err:
                last = type(err).__name__
            else:
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}"
            await asyncio.sleep(0.5)
        raise UserError(f"{self.base_url}/flush_cache failed {attempts} times (last: {last})")

    async def generate(self, payload: dict, incremental_text: bool = False) -> GenerateRecord:
        """POST /generate with streaming; time the first token and the gaps between chunks.

        Chunks carry the whole text so far, or only the new piece when the
        server runs with --incremental-streaming-output (`incremental_text`).
        """
        start = time.perf_counter()
        record = GenerateRecord(ok=False)
        try:
            # httpx's timeout bounds each read, and a stream trickled a byte at a time never trips
            # it: the whole answer is due within --request-timeout, as unstreamed.
            return await asyncio.wait_for(self._stream(payload, incremental_text, start, record), self.timeout_s)
        except asyncio.TimeoutError:
            record.error = f"no whole answer within --request-timeout {self.timeout_s:g}s"
            return record

    async def _stream(self, payload: dict, incremental_text: bool, start: float,
                      record: GenerateRecord) -> GenerateRecord:
        payload = {**payload, "stream": True}
        last_chunk_at = None
        try:
            async with self._pool() as http, http.stream("POST", "/generate", json=payload) as response:
                if response.status_code != 200:
                    record.error = _error_text(response, (await _body(response))[:1000])
                    return record
                async for line in _lines(response):
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = jsonread.parse_json(data, "a stream chunk", MAX_ANSWER_DEPTH)
                    if not isinstance(chunk, dict):
                        raise ValueError(f"stream chunk {json.dumps(chunk)[:40]} is not a JSON object")
                    if "error" in chunk:
                        record.error = f"stream error: {json.dumps(chunk['error'])[:200]}"
                        return record
                    now = time.perf_counter()
                    meta = chunk.get("meta_info") or {}
                    if not isinstance(meta, dict):
                        raise ValueError("stream chunk's meta_info is not an object")
                    tokens = _count(meta, "completion_tokens")
                    if tokens > record.completion_tokens:
                        if record.ttft_s is None:
                            record.ttft_s = now - start
                        else:
                            record.chunk_gaps_s.append(now - last_chunk_at)
                        last_chunk_at = now
                    record.completion_tokens = tokens
                    record.prompt_tokens = _count(meta, "prompt_tokens") or record.prompt_tokens
                    # Cumulative per request; a chunk without it must not reset the count.
                    record.spec_verify_ct = max(record.spec_verify_ct, _count(meta, "spec_verify_ct"))
                    piece = chunk.get("text") or ""
                    if not isinstance(piece, str):
                        raise ValueError("stream chunk's text is not a string")
                    record.text = record.text + piece if incremental_text else (piece or record.text)
        # TypeError: a count that is no number; OverflowError: one that is infinite
        except (httpx.HTTPError, ValueError, TypeError, OverflowError) as err:
            record.error = _exception_text(err)
            return record
        return _settled(record, start, "stream ended without tokens")

    async def generate_unstreamed(self, payload: dict) -> GenerateRecord:
        """POST /generate with "stream": false: the counts and the latency only (no TTFT, no chunk
        gaps). The steady mode's closed loop measures throughput, and a streamed answer costs
        the server output work per step that a plain answer does not."""
        payload = {**payload, "stream": False}
        start = time.perf_counter()
        record = GenerateRecord(ok=False)
        try:
            # httpx's timeout bounds each read, and a body trickled a byte at a time never
            # trips it: the whole answer is due within --request-timeout.
            response, content = await asyncio.wait_for(self._request("POST", "/generate", json=payload),
                                                       self.timeout_s)
            if response.status_code != 200:
                record.error = _error_text(response, content)
                return record
            body = jsonread.parse_json(content, "the /generate answer", MAX_ANSWER_DEPTH)
            if not isinstance(body, dict):
                raise ValueError(f"/generate answered {json.dumps(body)[:40]}, not a JSON object")
            if "error" in body:
                record.error = f"answer error: {json.dumps(body['error'])[:200]}"
                return record
            meta = body.get("meta_info") or {}
            if not isinstance(meta, dict):
                raise ValueError("the answer's meta_info is not an object")
            record.completion_tokens = _count(meta, "completion_tokens")
            record.prompt_tokens = _count(meta, "prompt_tokens")
            record.spec_verify_ct = _count(meta, "spec_verify_ct")
            reason = meta.get("finish_reason")
            record.aborted = isinstance(reason, dict) and reason.get("type") == "abort"
            text = body.get("text") or ""
            if not isinstance(text, str):
                raise ValueError("the answer's text is not a string")
            record.text = text
        # asyncio's own before Python 3.11, the builtin since.
        except asyncio.TimeoutError:
            record.error = f"no whole answer within --request-timeout {self.timeout_s:g}s"
            return record
        # TypeError: a count that is no number; OverflowError: one that is infinite
        except (httpx.HTTPError, ValueError, TypeError, OverflowError) as err:
            record.error = _exception_text(err)
            return record
        return _settled(record, start, "answer without tokens")

    async def abort(self, rid: str) -> bool:
        """POST /abort_request for one request this client sent with that "rid": False where the
        server refused it or did not answer in time. SGLang drops an abort for a rid it does not
        hold (yet, or any more)."""
        try:
            response, _ = await asyncio.wait_for(self._request("POST", "/abort_request", json={"rid": rid}),
                                                 self.timeout_s)
        except (asyncio.TimeoutError, httpx.HTTPError):
            return False
        return response.status_code == 200

    async def chat(self, payload: dict) -> ChatRecord:
        """POST /v1/chat/completions (not streamed: only the answer and usage matter)."""
        start = time.perf_counter()
        try:
            response, content = await asyncio.wait_for(self._request("POST", "/v1/chat/completions", json=payload),
                                                       self.timeout_s)
            if response.status_code != 200:
                return ChatRecord(ok=False, error=_error_text(response, content))
            message, tokens = _chat_answer(jsonread.parse_json(content, "the chat answer", MAX_ANSWER_DEPTH))
        except asyncio.TimeoutError:
            return ChatRecord(ok=False, error=f"no whole answer within --request-timeout {self.timeout_s:g}s")
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as err:
            return ChatRecord(ok=False, error=_exception_text(err))
        return ChatRecord(ok=True, message=message, completion_tokens=tokens, latency_s=time.perf_counter() - start)


def _settled(record: GenerateRecord, start: float, no_tokens: str) -> GenerateRecord:
    """A /generate record read to its end: timed, and ok unless it brought no token."""
    record.latency_s = time.perf_counter() - start
    if record.completion_tokens == 0:
        record.error = no_tokens
    else:
        record.ok = True
    return record


def _chat_answer(body) -> tuple[dict, int]:
    """(message, completion tokens) of a chat completion; ValueError for any other shape."""
    message = body["choices"][0]["message"]
    usage = body.get("usage") or {}
    if not isinstance(message, dict) or not isinstance(usage, dict):
        raise ValueError("chat completion without a message object")
    return message, int(usage.get("completion_tokens") or 0)
