"""Async HTTP client for the SGLang endpoints the benchmark drives.

One `ServerClient` per run; every request returns a record instead of raising,
so a failed request is counted and reported, never dropped.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from k26_ddtree.errors import UserError

API_KEY_ENV = "K26_API_KEY"


def read_api_key(api_key_file: str | None) -> str | None:
    """The API key from --api-key-file, else $K26_API_KEY, else None (never printed)."""
    if api_key_file:
        path = Path(api_key_file)
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


def _error_text(response: httpx.Response, body: bytes) -> str:
    snippet = body.decode(errors="replace").strip().replace("\n", " ")
    return f"HTTP {response.status_code}: {snippet[:200]}"


class ServerClient:
    """Bounded async client for one SGLang server."""

    def __init__(self, base_url: str, api_key: str | None, timeout_s: float, max_connections: int):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 30.0)),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def __aenter__(self) -> "ServerClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self._http.aclose()

    async def _get_json(self, path: str) -> dict:
        try:
            response = await self._http.get(path)
        except httpx.HTTPError as err:
            raise UserError(f"cannot reach {self.base_url}{path}: {type(err).__name__}: {err}") from None
        if response.status_code == 401:
            raise UserError(f"{self.base_url}{path} answered 401: give the API key (--api-key-file or ${API_KEY_ENV})")
        if response.status_code != 200:
            raise UserError(f"{self.base_url}{path} answered HTTP {response.status_code}")
        try:
            return response.json()
        except json.JSONDecodeError:
            raise UserError(f"{self.base_url}{path} did not answer JSON") from None

    async def server_info(self) -> dict:
        """GET /server_info (the older alias /get_server_info when the first is missing)."""
        try:
            return await self._get_json("/server_info")
        except UserError:
            return await self._get_json("/get_server_info")

    async def model_info(self) -> dict:
        """GET /model_info; {} when the server does not have it."""
        try:
            return await self._get_json("/model_info")
        except UserError:
            return {}

    async def model_name(self) -> str:
        data = (await self._get_json("/v1/models")).get("data") or []
        if not data:
            raise UserError(f"{self.base_url}/v1/models lists no model")
        return data[0]["id"]

    async def wait_healthy(self, timeout_s: float) -> None:
        """Poll /health_generate until 200; bounded by timeout_s."""
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                response = await self._http.get("/health_generate", timeout=20.0)
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}"
            except httpx.HTTPError as err:
                last = type(err).__name__
            await asyncio.sleep(1.0)
        raise UserError(f"{self.base_url} not healthy after {timeout_s:.0f}s (last: {last})")

    async def flush_cache(self, attempts: int = 10) -> None:
        """POST /flush_cache so the server's averages cover one cell.

        SGLang refuses (HTTP 400) while requests are still running, e.g. an
        aborted warm-up; retry a bounded number of times.
        """
        last = ""
        for _ in range(attempts):
            try:
                response = await self._http.post("/flush_cache")
            except httpx.HTTPError as err:
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
        payload = {**payload, "stream": True}
        start = time.perf_counter()
        record = GenerateRecord(ok=False)
        last_chunk_at = None
        try:
            async with self._http.stream("POST", "/generate", json=payload) as response:
                if response.status_code != 200:
                    record.error = _error_text(response, await response.aread())
                    return record
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        record.error = f"stream error: {json.dumps(chunk['error'])[:200]}"
                        return record
                    now = time.perf_counter()
                    meta = chunk.get("meta_info") or {}
                    tokens = int(meta.get("completion_tokens") or 0)
                    if tokens > record.completion_tokens:
                        if record.ttft_s is None:
                            record.ttft_s = now - start
                        else:
                            record.chunk_gaps_s.append(now - last_chunk_at)
                        last_chunk_at = now
                    record.completion_tokens = tokens
                    record.prompt_tokens = int(meta.get("prompt_tokens") or record.prompt_tokens)
                    # Cumulative per request; a chunk without it must not reset the count.
                    record.spec_verify_ct = max(record.spec_verify_ct, int(meta.get("spec_verify_ct") or 0))
                    piece = chunk.get("text") or ""
                    record.text = record.text + piece if incremental_text else (piece or record.text)
        except (httpx.HTTPError, json.JSONDecodeError, ValueError) as err:
            record.error = _exception_text(err)
            return record
        record.latency_s = time.perf_counter() - start
        if record.completion_tokens == 0:
            record.error = "stream ended without tokens"
            return record
        record.ok = True
        return record

    async def chat(self, payload: dict) -> ChatRecord:
        """POST /v1/chat/completions (not streamed: only the answer and usage matter)."""
        start = time.perf_counter()
        try:
            response = await self._http.post("/v1/chat/completions", json=payload)
            if response.status_code != 200:
                return ChatRecord(ok=False, error=_error_text(response, response.content))
            body = response.json()
            message = body["choices"][0]["message"]
        except (httpx.HTTPError, json.JSONDecodeError, KeyError, IndexError, TypeError) as err:
            return ChatRecord(ok=False, error=_exception_text(err))
        usage = body.get("usage") or {}
        return ChatRecord(
            ok=True,
            message=message,
            completion_tokens=int(usage.get("completion_tokens") or 0),
            latency_s=time.perf_counter() - start,
        )
